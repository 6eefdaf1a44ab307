"""The sandbox's question generator, ``model: "sandbox-rule-generator"`` on ``POST /v1/chat/completions``: a
deterministic **rule-based** stand-in for a language model, not a language model.

It answers the two prompts of ``weknora-nb testset generate`` (``weknora_nb/data/generate_prompts``), so that the
demo and the tests generate test sets offline. It reads the sections of the user message by their tags
(``<question_type>``, ``<passages>``, ``<question>``), the passages by their markers (``【原文 n】`` /
``[Passage n]``), and the language from the system message's script.

- **A question** (``<question_type>``): each passage's heading path is its first line when it holds `` › `` (the
  sandbox's chunks start so), else its first 20 characters; its *topic* is the last heading, its *document* the
  first. The question is a template of the type filled with the topics, which is what generators do that copy the
  chunk's words (their overlap with the chunk is high):

  - factual: ``{document}中关于“{topic}”是怎么规定的？`` / ``What does {document} say about {topic}?``
  - procedural: ``{topic}具体要怎么操作？`` / ``How do I do this: {topic}?``
  - comparison: ``{topic 1}和{topic 2}有什么区别？`` / ``How does {topic 1} differ from {topic 2}?``
  - multi-chunk: ``{topic 1}和{topic 2}分别要注意什么？`` / ``What matters for {topic 1} and {topic 2}?``
  - vague: ``{the topic's first four Han characters}那块老是出问题，怎么办？`` /
    ``Something is wrong with {the topic's first word}, help?``

  The reference answer is the first sentence of the first passage's first line of prose (at most 120
  characters). Chunks that
  share a heading path (a long section cut in pieces) give the same question: the near-duplicate filter's work.
- **An answerability check** (``<question>`` and ``<passages>``): answerable when the passages hold at least 20
  characters beside their headings and at least two, and at least half, of the question's units (Han bigrams,
  ASCII words and numbers, :func:`weknora_nb.sandbox.judge.units`; the templates' own words left out) are among the
  passages' units. A vague question keeps too little of its chunk, and is often found unanswerable.

The same request always gets the same reply; ``seed`` and ``temperature`` change nothing. ``usage`` counts tokens
by weknora-nb's estimate rule. Authentication and errors are the judge's (:class:`weknora_nb.sandbox.judge.RuleJudge`
serves this model beside its own).
"""

from __future__ import annotations

import re
from typing import Any

from weknora_nb.sandbox.judge import units

MODEL = "sandbox-rule-generator"
_MARKER = re.compile(r"^(?:【原文 \d+】|\[Passage \d+\])$", re.MULTILINE)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_SENTENCE = re.compile(r"(?<=[。！？!?；;])|(?<=[^\d\s]\.)\s|\n")
_TEMPLATES = {
    "zh": {"factual": "{doc}中关于“{t1}”是怎么规定的？", "procedural": "{t1}具体要怎么操作？",
           "comparison": "{t1}和{t2}有什么区别？", "multi-chunk": "{t1}和{t2}分别要注意什么？",
           "vague": "{short}那块老是出问题，怎么办？"},
    "en": {"factual": "What does {doc} say about {t1}?", "procedural": "How do I do this: {t1}?",
           "comparison": "How does {t1} differ from {t2}?", "multi-chunk": "What matters for {t1} and {t2}?",
           "vague": "Something is wrong with {short}, help?"},
}
#: the templates' own units (and the judge's question words), left out of an answerability check
_QUESTION_WORDS = ("什么 怎么 如何 哪些 哪个 是否 多少 怎样 为什么 how what which why when where who is are the a an "
                   "do does to of in for and or can i my")
_TEMPLATE_UNITS = frozenset().union(*(units(t.format(doc="", t1="", t2="", short="")) for lang in _TEMPLATES.values()
                                      for t in lang.values()), units(_QUESTION_WORDS))


def _section(text: str, tag: str) -> str | None:
    start = text.find(f"<{tag}>")
    end = text.find(f"</{tag}>", start + 1)
    return text[start + len(tag) + 2:end].strip() if start >= 0 and end > start else None


def _passages(block: str) -> list[str]:
    """The passages of a ``<passages>`` section, in order."""
    return [p.strip() for p in _MARKER.split(block) if p.strip()]


def _heading(passage: str) -> tuple[list[str], str]:
    """(the heading path, the text below it) of a passage (module docstring)."""
    first, _, rest = passage.partition("\n")
    if " › " in first:
        return [h.strip() for h in first.split(" › ") if h.strip()], rest.strip()
    return [first[:20].strip()], passage


def write_question(qtype: str, passages: list[str], language: str) -> dict[str, Any]:
    """The reply to a generation prompt: one question of ``qtype`` from ``passages`` and its reference answer."""
    heads = [_heading(p) for p in passages] or [([""], "")]
    doc, t1 = heads[0][0][0], heads[0][0][-1]
    t2 = heads[1][0][-1] if len(heads) > 1 else t1
    if language == "zh":
        han = "".join(_CJK.findall(t1))
        short = han[:4] or t1[:4]
    else:
        short = (t1.split() or [t1])[0]
    template = _TEMPLATES[language].get(qtype, _TEMPLATES[language]["factual"])
    question = template.format(doc=doc, t1=t1, t2=t2, short=short)
    answer = _first_sentence(heads[0][1], language) or t1

    return {"questions": [{"question": question, "answer": answer}]}


def _first_sentence(body: str, language: str) -> str:
    """The first sentence of the first line of prose (not a code fence, a table row or a list of symbols), at most
    120 characters."""
    for line in body.splitlines():
        line = line.strip()
        prose = han_count(line) >= 2 if language == "zh" else len(line.split()) >= 3
        if prose and not line.startswith(("```", "|")):
            return next((s.strip() for s in _SENTENCE.split(line) if s.strip()), line)[:120]
    return ""


def han_count(text: str) -> int:
    return len(_CJK.findall(text))


def check_answerable(question: str, passages: list[str], language: str) -> dict[str, Any]:
    """The reply to an answerability prompt (module docstring)."""
    bodies = [_heading(p)[1] if " › " in p.partition("\n")[0] else p for p in passages]
    text_chars = sum(len(b.strip()) for b in bodies)
    asked = units(question) - _TEMPLATE_UNITS
    found = asked & units("\n".join(passages))
    share = len(found) / len(asked) if asked else 0.0
    answerable = text_chars >= 20 and len(found) >= 2 and share >= 0.5
    if language == "zh":
        reason = f"规则判断：问题要点 {len(found)}/{len(asked)} 见于原文，原文正文 {text_chars} 字"
    else:
        reason = f"rule-based: {len(found)} of {len(asked)} question units in the passages, {text_chars} characters"
    return {"answerable": answerable, "reason": reason}


def reply(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reply object to a request's ``messages``: a question, an answerability verdict, or None (not a prompt of
    ``testset generate``)."""
    system = " ".join(m["content"] for m in messages if m.get("role") == "system")
    language = "zh" if _CJK.search(system) else "en"
    user = next((m["content"] for m in reversed(messages) if m.get("role") == "user" and "<passages>" in m["content"]),
                None)
    if user is None:
        return None
    passages = _passages(_section(user, "passages") or "")
    qtype = _section(user, "question_type")
    if qtype is not None:
        return write_question(qtype.split("（")[0].strip(), passages, language)
    question = _section(user, "question")
    return None if question is None else check_answerable(question, passages, language)
