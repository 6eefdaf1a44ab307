r"""The sandbox's ``POST /v1/chat/completions``: a deterministic **rule-based** judge, not a language model.

It answers weknora-nb's judge prompts (``weknora_nb/data/judge_prompts``) in the OpenAI chat-
completions format, as ``model: "sandbox-rule-judge"``, so that the demo and the tests judge
offline. It reads the sections of the user message by their tags (``<question>``,
``<reference_answer>``, ``<cited_context>``, ``<answer>``; pairwise ``<answer_1_context>``,
``<answer_1>``, ``<answer_2_context>``, ``<answer_2>``) and scores by word overlap:

- **Units** of a text: the character bigrams of each run of Han characters (a one-character run is
  itself), the lower-cased ASCII words and identifiers (``x-dg-key``, ``dg-1003``, ``gateway.yaml``)
  and the numbers (``8``, ``4.2``); citation markers ``[n]`` are dropped first.
- **correctness** = the share of the reference answer's units found among the answer's, numbers
  and ASCII words weighing 3, bigrams 1: >= 0.8 -> 5, >= 0.6 -> 4, >= 0.4 -> 3, >= 0.2 -> 2,
  else 1; null without a reference answer ("（无）" / "(none)").
- **faithfulness** = the share of the answer's statements supported by the cited passages: a
  statement is a sentence (split at 。！？!?；; and line ends) with at least 3 units, a line wholly
  in brackets left out (a remark about the answer, such as the sandbox chat's note that it quotes
  the source); it is supported when >= 60 % of its units are in the passages: >= 0.9 -> 5, >= 0.7 -> 4,
  >= 0.5 -> 3, >= 0.25 -> 2, else 1; no statement -> 3; statements without passages -> 1.
- **relevance** = the share of the question's units (question words such as 什么, 如何, how, what
  left out) found in the answer: >= 0.6 -> 5, >= 0.45 -> 4, >= 0.3 -> 3, >= 0.15 -> 2, else 1.
- **jitter**, so that judge repeats can differ as a language model's do: with ``temperature`` > 0
  each score moves one point up or down (kept within 1-5) with probability min(0.3, 0.2 x
  temperature), drawn from a random stream seeded by the request's ``seed``, the criterion and
  the user message. The same request always gets the same reply; at temperature 0 there is none.
- **pairwise**: the answer whose three scores (without jitter; correctness left out without a
  reference) sum higher is better, equal sums a tie. The rule sees no position, so both orders
  agree.

``usage`` counts tokens by weknora-nb's estimate rule (1 per CJK character, 1 per 4 other
characters, + 4 per message + 3). Requests need ``Authorization: Bearer <a sandbox API key>``
(401 otherwise) and ``model: "sandbox-rule-judge"`` (404 ``model_not_found`` otherwise); a prompt
without the sections is a 400. Other rule-based models may be served beside it (``others``: the sandbox's
question generator, :mod:`weknora_nb.sandbox.generator`), each asked by its name. The fault injection of
:mod:`weknora_nb.sandbox.faults` applies.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from weknora_nb.sandbox.auth import KeyRing

MODEL = "sandbox-rule-judge"
_HAN_RUN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]+")
_ASCII = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/:]*[A-Za-z0-9]|[A-Za-z0-9]")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_MARKER = re.compile(r"\[\d+\]")
_SENTENCE_END = re.compile(r"[。！？!?；;\n]+")
#: a remark about the answer: a line wholly in brackets
_REMARK = re.compile(r"^[ \t]*[（(][^\n]*[）)][ \t]*$", re.MULTILINE)
_CJK_CHAR = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_NONE = ("（无）", "(none)", "")
#: question words left out of the question's units (bigrams and words)
_QUESTION_WORDS = frozenset(["什么", "怎么", "如何", "哪些", "哪个", "是否", "多少", "为什", "么办", "怎样", "吗", "呢",
                             "how", "what", "which", "why", "when", "where", "who", "is", "are", "the", "a", "an",
                             "do", "does", "to", "of", "in", "for", "and", "or", "can", "i", "my"])
_CUTS = {"correctness": (0.8, 0.6, 0.4, 0.2), "faithfulness": (0.9, 0.7, 0.5, 0.25),
         "relevance": (0.6, 0.45, 0.3, 0.15)}


def units(text: str) -> set[str]:
    """The units of ``text`` (module docstring): Han bigrams, lower-cased ASCII words, numbers."""
    text = _MARKER.sub(" ", text)
    out: set[str] = set()
    for run in _HAN_RUN.findall(text):
        out.update(run[i:i + 2] for i in range(max(1, len(run) - 1)))
    out.update(m.group(0).lower() for m in _ASCII.finditer(text))
    return out


def _weight(unit: str) -> int:
    return 1 if _HAN_RUN.fullmatch(unit) else 3


def _score(share: float, criterion: str) -> int:
    """1-5 from a share in [0, 1] by the criterion's cut points."""
    return 5 - next((i for i, cut in enumerate(_CUTS[criterion]) if share >= cut), 4)


def _statements(answer: str) -> list[set[str]]:
    """The units of each statement of the answer (sentences of >= 3 units; lines wholly in brackets left out)."""
    out = []
    for sentence in _SENTENCE_END.split(_REMARK.sub("", answer)):
        u = units(sentence)
        if len(u) >= 3:
            out.append(u)
    return out


def judge_scores(question: str, reference: str | None, context: str, answer: str,
                 language: str = "zh") -> dict[str, dict[str, Any]]:
    """The three scores and their reasons (no jitter), in the judge prompts' reply format."""
    zh = language == "zh"
    ans = units(answer)
    out: dict[str, dict[str, Any]] = {}
    if reference is None or reference.strip() in _NONE:
        out["correctness"] = {"score": None, "reason": "无参考答案" if zh else "no reference answer"}
    else:
        ref = units(reference)
        total = sum(_weight(u) for u in ref)
        found = sum(_weight(u) for u in ref if u in ans)
        share = found / total if total else 0.0
        s = _score(share, "correctness")
        reason = (f"规则评分：参考答案要点（加权）{found}/{total} 出现在回答中，{share:.0%} → {s}" if zh else
                  f"rule-based: {found} of {total} weighted reference units found in the answer ({share:.0%}) -> {s}")
        out["correctness"] = {"score": s, "reason": reason}
    statements = _statements(answer)
    ctx = units(context) if context.strip() not in _NONE else set()
    supported = sum(1 for st in statements if ctx and len(st & ctx) >= 0.6 * len(st))
    if not statements:
        s, share = 3, math.nan
    else:
        share = supported / len(statements)
        s = _score(share, "faithfulness") if ctx else 1
    reason = (f"规则评分：{supported}/{len(statements)} 句有引用资料支持 → {s}" if zh else
              f"rule-based: {supported} of {len(statements)} statements supported by the cited passages -> {s}")
    out["faithfulness"] = {"score": s, "reason": reason}
    q = {u for u in units(question) if u not in _QUESTION_WORDS}
    covered = len(q & ans)
    share = covered / len(q) if q else 0.5
    s = _score(share, "relevance") if q else 3
    out["relevance"] = {"score": s, "reason": (f"规则评分：问题关键词 {covered}/{len(q)} 出现在回答中 → {s}" if zh else
                                               f"rule-based: {covered} of {len(q)} question terms found in the "
                                               f"answer -> {s}")}
    return out


def _jittered(scores: dict[str, dict[str, Any]], temperature: float, seed: Any, prompt: str,
              zh: bool) -> dict[str, dict[str, Any]]:
    """Each score moved one point with probability min(0.3, 0.2 x temperature), seeded (module docstring)."""
    p = min(0.3, 0.2 * temperature)
    if p <= 0:
        return scores
    out = {}
    for criterion, item in scores.items():
        digest = hashlib.sha256(json.dumps([seed, criterion, prompt], ensure_ascii=False).encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        score = item["score"]
        if score is not None and rng.random() < p:
            moved = min(5, max(1, score + rng.choice((-1, 1))))
            if moved != score:
                note = f"（随机抖动 {moved - score:+d}）" if zh else f" (jitter {moved - score:+d})"
                item = {"score": moved, "reason": item["reason"] + note}
        out[criterion] = item
    return out


def judge_pair(question: str, reference: str | None, first: tuple[str, str], second: tuple[str, str],
               language: str = "zh") -> dict[str, str]:
    """``{"better": "1" | "2" | "tie", "reason"}``: the higher sum of the rule's scores (``first`` and
    ``second`` are (context, answer))."""
    sums = []
    for context, answer in (first, second):
        scores = judge_scores(question, reference, context, answer, language)
        sums.append(sum(v["score"] for v in scores.values() if v["score"] is not None))
    better = "1" if sums[0] > sums[1] else "2" if sums[1] > sums[0] else "tie"
    reason = (f"规则评分：回答 1 合计 {sums[0]}，回答 2 合计 {sums[1]}" if language == "zh" else
              f"rule-based: answer 1 sums {sums[0]}, answer 2 sums {sums[1]}")
    return {"better": better, "reason": reason}


def _section(text: str, tag: str) -> str | None:
    """The text between ``<tag>`` and ``</tag>`` (the judge neutralises these tags inside values)."""
    start = text.find(f"<{tag}>")
    end = text.find(f"</{tag}>", start + 1)
    return text[start + len(tag) + 2:end].strip() if start >= 0 and end > start else None


def estimate_tokens(text: str) -> int:
    """weknora-nb's estimate rule: 1 token per CJK character, 1 per 4 other characters (rounded up)."""
    cjk = len(_CJK_CHAR.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def error_response(status: int, message: str, kind: str, code: str | None = None) -> Response:
    """An error in OpenAI's form: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def bad_request(status: int, message: str, *, code: str | None = None) -> Response:
    """:func:`error_response` of type ``invalid_request_error`` (a 4xx the client caused)."""
    return error_response(status, message, "invalid_request_error", code)


async def authorised_json(request: Request, keys: KeyRing) -> tuple[Any, Response | None]:
    """The JSON body of an OpenAI-style request made with a sandbox key as its bearer token: ``(body, None)``, or
    ``(None, the 401 / 400 to answer)``."""
    header = request.headers.get("authorization", "")
    if not (header.startswith("Bearer ") and keys.lookup(header[7:].strip()) is not None):
        return None, bad_request(401, "Incorrect API key provided", code="invalid_api_key")
    try:
        return json.loads(await request.body() or b"null"), None
    except ValueError:
        return None, bad_request(400, "the body is not JSON")


def completion_response(text: str, messages: list[dict[str, Any]], model: str, fingerprint: str) -> Response:
    """A chat completion in OpenAI's form whose reply is ``text``; ``usage`` by weknora-nb's estimate rule."""
    prompt_tokens = sum(estimate_tokens(m["content"]) + 4 for m in messages) + 3
    return JSONResponse({
        "id": "chatcmpl-sandbox-" + hashlib.sha256(text.encode()).hexdigest()[:24], "object": "chat.completion",
        "created": int(time.time()), "model": model, "system_fingerprint": fingerprint,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": estimate_tokens(text),
                  "total_tokens": prompt_tokens + estimate_tokens(text)}})


class RuleJudge:
    """The endpoints: ``POST /v1/chat/completions`` and ``GET /v1/models``; keys are the sandbox's."""

    #: the models this endpoint answers as (a subclass adds its own, :class:`weknora_nb.sandbox.grader.RuleGrader`)
    served: tuple[str, ...] = (MODEL,)

    def __init__(self, keys: KeyRing, others: dict[str, Callable[[list[dict[str, Any]]], Any]] | None = None):
        """``others``: more rule-based models served here by name (the sandbox's question generator): each gets
        the messages of a request to it, and gives the reply object, or None for a prompt it does not read."""
        self.keys = keys
        self.others = dict(others or {})
        self.requests = 0

    def _authorised(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        return header.startswith("Bearer ") and self.keys.lookup(header[7:].strip()) is not None

    async def models(self, request: Request) -> Response:
        if not self._authorised(request):
            return error_response(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key")
        return JSONResponse({"object": "list", "data": [{"id": m, "object": "model", "created": 0,
                                                         "owned_by": "weknora-nb sandbox (rule-based)"}
                                                        for m in (*self.served, *self.others)]})

    async def chat_completions(self, request: Request) -> Response:
        """One judgement in the chat-completions format (module docstring)."""
        self.requests += 1
        body, refused = await authorised_json(request, self.keys)
        if refused is not None:
            return refused
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                     for m in messages) or not messages:
            return error_response(400, "messages must be a non-empty list of {role, content}", "invalid_request_error")
        model = body.get("model")
        if model not in self.served and model not in self.others:
            names = ", ".join(map(repr, (*self.served, *self.others)))
            return error_response(404, f"The model {model!r} does not exist; the sandbox serves {names}, rule-based "
                                  "(not language models)", "invalid_request_error", "model_not_found")
        if body.get("stream"):
            return error_response(400, "stream is not supported by the sandbox's judge", "invalid_request_error")
        temperature = body.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            return error_response(400, "temperature must be a number", "invalid_request_error")
        if model in self.others:
            other = self.others[model](messages)
            if other is None:
                return error_response(400, f"the sandbox's {model} reads weknora-nb's prompts for it; this request "
                                      "holds none", "invalid_request_error")
            return completion_response(json.dumps(other, ensure_ascii=False), messages, model, f"weknora-nb-{model}-v1")
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user" and "<question>" in
                     m["content"]), None)
        if user is None:
            return error_response(400, "the sandbox's rule-based judge reads weknora-nb's judge prompts (a user "
                                  "message with <question>, <answer> ... sections); this request has none",
                                  "invalid_request_error")
        reply = self.reply(user, messages, float(temperature), body.get("seed"))
        return completion_response(json.dumps(reply, ensure_ascii=False), messages, str(model),
                                   "weknora-nb-sandbox-rule-judge-v1")

    def reply(self, user: str, messages: list[dict[str, Any]], temperature: float, seed: Any) -> dict[str, Any]:
        """The reply object: three scores (pointwise) or a verdict (pairwise)."""
        zh = any(_CJK_CHAR.search(m["content"]) for m in messages if m.get("role") == "system")
        language = "zh" if zh else "en"
        question = _section(user, "question") or ""
        reference = _section(user, "reference_answer")
        if "<answer_1>" in user:
            first = (_section(user, "answer_1_context") or "", _section(user, "answer_1") or "")
            second = (_section(user, "answer_2_context") or "", _section(user, "answer_2") or "")
            return judge_pair(question, reference, first, second, language)
        scores = judge_scores(question, reference, _section(user, "cited_context") or "",
                              _section(user, "answer") or "", language)
        return _jittered(scores, temperature, seed, user, zh)
