"""The judge's prompts and the strict reading of its replies.

Prompts are versioned text files, ``weknora_nb/data/judge_prompts/<version>.<language>.txt``
(``v1.zh.txt``, ``v1.en.txt``, ``pairwise-v1.zh.txt``, ...): comment lines (``#``), then
``=== system ===`` and ``=== user ===``, each the text of one chat message, with ``{{name}}``
placeholders. A prompt is named by its version and language (``v1.zh``) and identified by the
sha256 of its file; a judge manifest records both. A changed prompt is a new version.

The values filled in are the texts of the run (question, reference answer, cited passages,
answer). The user message wraps each in a tag of its own (``<question>`` ... ``</question>``);
a value that holds one of these tags has it written ``[question]`` so that no text can close a
section early (the sandbox's rule-based judge reads the sections by these tags).

Replies are read strictly against :func:`pointwise_schema` / :data:`PAIRWISE_SCHEMA` (JSON
Schema, draft 2020-12): one JSON object and nothing else; a Markdown fence around it
(```` ```json ... ``` ````) is tolerated, nothing more. A reply that is not one is an
:class:`InvalidReply` of kind ``unparseable`` (not JSON), ``schema`` (JSON of another shape:
a key missing or extra, a score that is no number, a reason that is no string) or
``out_of_range`` (a score that is not an integer from 1 to 5). It is never a score.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import UsageError, reading

PROMPT_DIR = Path(__file__).resolve().parents[2] / "data" / "judge_prompts"
CRITERIA = ("correctness", "faithfulness", "relevance")
LANGUAGES = ("zh", "en")
POINTWISE_VERSION = "v1"
PAIRWISE_VERSION = "pairwise-v1"
#: the sections of the user messages; a value holding one of these tags has it neutralised
SECTION_TAGS = ("question", "reference_answer", "cited_context", "answer", "answer_1_context", "answer_1",
                "answer_2_context", "answer_2", "passage")
#: what stands for a missing reference answer or an answer without citations
NONE_TEXT = {"zh": "（无）", "en": "(none)"}
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_TAG = re.compile(r"<(/?)(" + "|".join(SECTION_TAGS) + r")>")
_FENCE = re.compile(r"\A```(?:json|JSON)?[ \t]*\n(.*?)\n?```\Z", re.DOTALL)
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_VERDICTS = ("1", "2", "tie")


@dataclass(frozen=True)
class Prompt:
    """One prompt file: its name (``v1.zh``), the two messages' templates and the file's sha256."""

    version: str
    language: str
    system: str
    user: str
    sha256: str
    fields: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.version}.{self.language}"

    def render(self, **values: str) -> list[dict[str, str]]:
        """The chat messages with every ``{{name}}`` replaced by ``values[name]`` (neutralised), in one pass."""
        missing = sorted(set(self.fields) - set(values))
        if missing:
            raise UsageError(f"prompt {self.name} needs the values {missing}")
        user = _PLACEHOLDER.sub(lambda m: neutralise(values[m.group(1)]), self.user)
        return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]


class InvalidReply(ValueError):
    """A reply that is not what the prompt asked for; ``kind``: unparseable, schema or out_of_range."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def load_prompt(version: str, language: str, folder: str | Path = PROMPT_DIR) -> Prompt:
    """The prompt ``<folder>/<version>.<language>.txt``; a :class:`UsageError` names the prompts there
    when it does not exist, an :class:`~weknora_nb.core.errors.InputError` when it cannot be read."""
    if language not in LANGUAGES:
        raise UsageError(argument="--language", allowed=["auto", *LANGUAGES], got=language)
    path = Path(folder) / f"{version}.{language}.txt"
    if not path.is_file():
        have = sorted(p.name[:-4] for p in Path(folder).glob("*.txt"))
        raise UsageError(argument="the prompt version", allowed=have, got=f"{version}.{language}")
    with reading(path):
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    system, user = _sections(text, path)
    fields = tuple(dict.fromkeys(_PLACEHOLDER.findall(user)))
    return Prompt(version, language, system, user, "sha256:" + hashlib.sha256(raw).hexdigest(), fields)


def _sections(text: str, path: Path) -> tuple[str, str]:
    """The system and user templates of a prompt file (comment lines before them dropped)."""
    head, sep, rest = text.partition("=== system ===\n")
    system, sep2, user = rest.partition("=== user ===\n")
    if not sep or not sep2 or any(line.strip() and not line.startswith("#") for line in head.splitlines()):
        raise UsageError(f"prompt file {path} must hold comment lines, then '=== system ===', then '=== user ==='")
    return system.strip(), user.strip()


def neutralise(value: str) -> str:
    """``value`` with the section tags it may hold written ``[tag]`` / ``[/tag]``."""
    return _TAG.sub(lambda m: f"[{m.group(1)}{m.group(2)}]", value)


def detect_language(*texts: str | None) -> str:
    """``zh`` when the texts hold a Han character, else ``en`` (the script decides, not a model)."""
    return "zh" if any(t and _CJK.search(t) for t in texts) else "en"


# ---------------------------------------------------------------------------------------
# replies
# ---------------------------------------------------------------------------------------
def pointwise_schema(reference_given: bool = True) -> dict[str, Any]:
    """The JSON Schema a pointwise reply must meet; without a reference answer correctness's score may be null."""
    def criterion(nullable: bool) -> dict[str, Any]:
        score: dict[str, Any] = {"type": ["integer", "null"] if nullable else "integer", "minimum": 1, "maximum": 5}
        return {"type": "object", "required": ["score", "reason"], "additionalProperties": False,
                "properties": {"score": score, "reason": {"type": "string"}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "required": list(CRITERIA), "additionalProperties": False,
            "properties": {c: criterion(c == "correctness" and not reference_given) for c in CRITERIA}}


PAIRWISE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "required": ["better", "reason"],
    "additionalProperties": False,
    "properties": {"better": {"enum": list(_VERDICTS)}, "reason": {"type": "string"}}}


def json_object(text: str) -> dict[str, Any]:
    """The one JSON object ``text`` is (a Markdown fence around it tolerated), else :class:`InvalidReply`."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        obj = json.loads(body, object_pairs_hook=_no_key_twice)
    except _KeyTwice as exc:
        raise InvalidReply("schema", f"the reply writes the key {exc.key!r} twice: which value is meant is not "
                                     "known") from None
    except (ValueError, RecursionError):
        raise InvalidReply("unparseable", f"the reply is not one JSON object: {_shown(text)}") from None
    if not isinstance(obj, dict):
        raise InvalidReply("schema", f"the reply is a JSON {type(obj).__name__}, not an object")
    return obj


class _KeyTwice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_key_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refused when a key is written twice (``json`` would keep the last one
    silently, as the test-set loaders refuse it too)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _KeyTwice(key)
        seen[key] = value
    return seen


def exact_keys(obj: dict[str, Any], wanted: tuple[str, ...], where: str) -> None:
    """An :class:`InvalidReply` of kind ``schema`` unless ``obj`` holds exactly the keys ``wanted``."""
    missing, extra = [k for k in wanted if k not in obj], sorted(set(obj) - set(wanted))
    if missing or extra:
        said = "; ".join(([f"missing {missing}"] if missing else []) + ([f"unexpected {extra}"] if extra else []))
        raise InvalidReply("schema", f"{where}: {said} (wanted exactly {list(wanted)})")


def _score(value: Any, where: str, nullable: bool) -> int | None:
    """An integer 1-5 (an integral float such as 4.0 counts, as in JSON Schema); None when ``nullable``."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidReply("schema", f"{where}.score is {json.dumps(value, ensure_ascii=False)[:40]}, not a number")
    if value != value or value % 1 != 0 or not 1 <= value <= 5:  # NaN, 3.5, 0, 7
        raise InvalidReply("out_of_range", f"{where}.score is {value!r}, not an integer from 1 to 5")
    return int(value)


def parse_scores(text: str, *, reference_given: bool = True) -> dict[str, dict[str, Any]]:
    """``{"correctness": {"score": 4, "reason": "..."}, ...}`` read from a reply, or :class:`InvalidReply`.

    Without a reference answer correctness's score must be null or an integer 1-5, and is kept as None
    (no reference, no correctness).
    """
    obj = json_object(text)
    exact_keys(obj, CRITERIA, "the reply")
    out: dict[str, dict[str, Any]] = {}
    for c in CRITERIA:
        item = obj[c]
        if not isinstance(item, dict):
            raise InvalidReply("schema", f"{c} is not an object with score and reason")
        exact_keys(item, ("score", "reason"), c)
        if not isinstance(item["reason"], str):
            raise InvalidReply("schema", f"{c}.reason is not a string")
        unjudged = c == "correctness" and not reference_given
        score = _score(item["score"], c, nullable=unjudged)
        out[c] = {"score": None if unjudged else score, "reason": item["reason"]}
    return out


def parse_verdict(text: str) -> dict[str, str]:
    """``{"better": "1" | "2" | "tie", "reason": "..."}`` read from a pairwise reply, or :class:`InvalidReply`
    (``better`` given as the number 1 or 2 is read as "1" or "2")."""
    obj = json_object(text)
    exact_keys(obj, ("better", "reason"), "the reply")
    better = obj["better"]
    if isinstance(better, int) and not isinstance(better, bool):
        better = str(better)
    if better not in _VERDICTS:
        raise InvalidReply("out_of_range", f"better is {json.dumps(obj['better'], ensure_ascii=False)[:40]}, "
                           "not \"1\", \"2\" or \"tie\"")
    if not isinstance(obj["reason"], str):
        raise InvalidReply("schema", "reason is not a string")
    return {"better": better, "reason": obj["reason"]}


def correction(problem: InvalidReply, language: str) -> str:
    """The message that asks again after an invalid reply (what was wrong, in the prompt's language)."""
    if language == "zh":
        return f"你的回复不符合要求：{problem}。请只输出要求的 JSON 对象，不要输出其他任何文字。"
    return f"Your reply was not valid: {problem}. Reply with the JSON object asked for and nothing else."


def _shown(text: str, n: int = 80) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= n else flat[: n - 3] + "...")
