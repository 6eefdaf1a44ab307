"""The prompts of ``testset generate`` and the strict reading of their replies.

Two versioned prompts per language (``weknora_nb/data/generate_prompts/<version>.<language>.txt``, read by the
judge's loader, :func:`weknora_nb.collect.judge.prompts.load_prompt`): ``generate-v1`` asks for one question of a
type from one or two passages with its reference answer, ``answerable-v1`` asks whether a question is answered
fully by its passages. The passages are numbered (``【原文 1】`` / ``[Passage 1]``); a passage or question that
holds a section tag of these prompts has it written ``[tag]``, so that no text closes a section early (the
sandbox's generator reads the sections by their tags).

Replies are read as the judge reads its own (:func:`~weknora_nb.collect.judge.prompts.json_object`: one JSON object,
a Markdown fence tolerated, a key written twice refused) and then strictly; a reply that fails is an
:class:`~weknora_nb.collect.judge.prompts.InvalidReply`, asked again and, after the retries, recorded as failed:

- :func:`parse_questions`: exactly ``{"questions": [{"question": str, "answer": str}]}`` with one question. An empty
  list or an empty question is kind ``empty``; a question not in the knowledge base's language is kind
  ``language`` (Chinese: fewer than two Han characters, the mark of an English reply to a Chinese prompt; English:
  any Han character); a question longer than :data:`MAX_QUESTION` characters, another shape, kind ``schema``.
  Whitespace inside the texts is collapsed to single spaces.
- :func:`parse_answerable`: exactly ``{"answerable": true | false, "reason": str}``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.prompts import InvalidReply, Prompt, exact_keys, json_object, load_prompt
from weknora_nb.core.synthetic import han_count

GENERATE_PROMPT_DIR = Path(__file__).resolve().parents[2] / "data" / "generate_prompts"
GENERATE_VERSION, ANSWERABLE_VERSION = "generate-v1", "answerable-v1"
#: the longest question kept, in characters
MAX_QUESTION = 300
#: the section tags of the two prompts, neutralised inside the values
_TAG = re.compile(r"<(/?)(passages|question_type|question)>")
_PASSAGE = {"zh": "【原文 {i}】", "en": "[Passage {i}]"}
#: how the question types are named to the model (the prompt explains each)
TYPE_NAMES = {"zh": {"factual": "factual（事实）", "procedural": "procedural（操作）",
                     "comparison": "comparison（比较）", "multi-chunk": "multi-chunk（多段）",
                     "vague": "vague（模糊）"},
              "en": {t: t for t in ("factual", "procedural", "comparison", "multi-chunk", "vague")}}


def load_prompts(language: str) -> dict[str, Prompt]:
    """The two prompts of ``language``, by their version (``generate-v1``, ``answerable-v1``)."""
    return {v: load_prompt(v, language, GENERATE_PROMPT_DIR) for v in (GENERATE_VERSION, ANSWERABLE_VERSION)}


def passages(texts: list[str], language: str) -> str:
    """The passages as the prompts show them: numbered, one after another, tags neutralised."""
    return "\n\n".join(f"{_PASSAGE[language].format(i=i)}\n{neutralise(t.strip())}"
                       for i, t in enumerate(texts, start=1))


def neutralise(value: str) -> str:
    """``value`` with the prompts' section tags written ``[tag]`` / ``[/tag]``."""
    return _TAG.sub(lambda m: f"[{m.group(1)}{m.group(2)}]", value)


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item[key]
    if not isinstance(value, str):
        raise InvalidReply("schema", f"{where}.{key} is not a string")
    return " ".join(value.split())


def parse_questions(text: str, language: str) -> list[dict[str, str]]:
    """``[{"question": ..., "answer": ...}]`` (one) read from a generation reply, or :class:`InvalidReply`
    (module docstring)."""
    obj = json_object(text)
    exact_keys(obj, ("questions",), "the reply")
    items = obj["questions"]
    if not isinstance(items, list):
        raise InvalidReply("schema", "questions is not a list")
    if not items:
        raise InvalidReply("empty", "questions is an empty list: no question was written")
    if len(items) != 1:
        raise InvalidReply("schema", f"questions holds {len(items)} items; exactly 1 was asked for")
    item = items[0]
    if not isinstance(item, dict):
        raise InvalidReply("schema", "questions[0] is not an object with question and answer")
    exact_keys(item, ("question", "answer"), "questions[0]")
    question, answer = _text(item, "question", "questions[0]"), _text(item, "answer", "questions[0]")
    if not question:
        raise InvalidReply("empty", "questions[0].question is empty")
    if len(question) > MAX_QUESTION:
        raise InvalidReply("schema", f"questions[0].question is {len(question)} characters long; at most "
                                     f"{MAX_QUESTION} are kept")
    if language == "zh" and han_count(question) < 2:
        raise InvalidReply("language", f"the question is not in Chinese, the knowledge base's language: {question!r}")
    if language == "en" and han_count(question):
        raise InvalidReply("language", f"the question is not in English, the knowledge base's language: {question!r}")
    return [{"question": question, "answer": answer}]


def parse_answerable(text: str) -> dict[str, Any]:
    """``{"answerable": bool, "reason": str}`` read from an answerability reply, or :class:`InvalidReply`."""
    obj = json_object(text)
    exact_keys(obj, ("answerable", "reason"), "the reply")
    if not isinstance(obj["answerable"], bool):
        raise InvalidReply("schema", f"answerable is {obj['answerable']!r}, not true or false")
    if not isinstance(obj["reason"], str):
        raise InvalidReply("schema", "reason is not a string")
    return {"answerable": obj["answerable"], "reason": obj["reason"]}
