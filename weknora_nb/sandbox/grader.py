"""The sandbox's relevance grader: a deterministic **rule-based** grader with a known bias, not a language model.

``POST /v1/chat/completions`` with ``model: "sandbox-rule-grader"`` answers weknora-nb's relevance prompts
(``weknora_nb/data/judge_prompts/relevance-v1.*.txt``: a user message with ``<question>`` and ``<passage>``
sections) in the OpenAI chat-completions format, so that the demo and the tests grade pools offline
(:mod:`weknora_nb.sandbox.judge` serves the route and its auth, faults and usage). The rule:

- **units** are the judge's (:func:`weknora_nb.sandbox.judge.units`: Han bigrams, lower-cased ASCII words and
  identifiers, numbers); the question's, question words (什么, 如何, how, ...) left out;
- **share** = the weight of the question's units found in the passage (its title line included) over the weight
  of all of them, numbers and ASCII words weighing 3, Han bigrams 1;
- **its fair grade**: share >= 0.6 -> 3, >= 0.4 -> 2, >= 0.2 -> 1, else 0;
- **its bias, known and by design**: one grade more (at most 3) for every passage whose fair grade is at least 1:
  the grader is **lenient**, it never gives 1 and it over-grades whatever shares a fifth of the question's words,
  as the LLM assessors of TREC 2024 RAG (UMBRELA) were more lenient than NIST's. On the demo's labelled chunks it
  grades higher than the assessors far more often than lower (``weknora-nb testset calibration``).

The same request always gets the same reply (no jitter, whatever the temperature). Every page that shows these
grades says that they come from this rule, not from a language model.
"""

from __future__ import annotations

from typing import Any

from weknora_nb.sandbox.judge import _QUESTION_WORDS, RuleJudge, _section, _weight, units
from weknora_nb.sandbox.judge import MODEL as JUDGE_MODEL

MODEL = "sandbox-rule-grader"
#: the fair grade's cut points on the share of the question's units found in the passage: 3, 2, 1
CUTS = (0.6, 0.4, 0.2)
#: the known bias: grades added to every fair grade of at least 1 (capped at 3)
LENIENCY = 1


def grade_passage(question: str, passage: str, language: str = "zh") -> dict[str, Any]:
    """``{"grade": 0-3, "reason": "..."}`` by the rule of the module docstring."""
    q = {u for u in units(question) if u not in _QUESTION_WORDS}
    p = units(passage)
    total = sum(_weight(u) for u in q)
    found = sum(_weight(u) for u in q if u in p)
    share = found / total if total else 0.0
    fair = 3 - next((i for i, cut in enumerate(CUTS) if share >= cut), 3)
    grade = min(3, fair + LENIENCY) if fair >= 1 else 0
    if language == "zh":
        reason = (f"规则评分（非语言模型）：问题要点（加权）{found}/{total} 出现在片段中（{share:.0%}），"
                  f"基础等级 {fair}" + (f"，宽松 +{grade - fair} → {grade}" if grade != fair else ""))
    else:
        reason = (f"rule-based (not a language model): {found} of {total} weighted question units in the passage "
                  f"({share:.0%}), fair grade {fair}" + (f", lenient +{grade - fair} -> {grade}" if grade != fair
                                                         else ""))
    return {"grade": grade, "reason": reason}


class RuleGrader(RuleJudge):
    """The sandbox's ``/v1/chat/completions`` as both rule-based models: ``sandbox-rule-grader`` answers a relevance
    prompt (a ``<passage>`` section) by :func:`grade_passage`, anything else is the judge's
    (:class:`~weknora_nb.sandbox.judge.RuleJudge`)."""

    served = (JUDGE_MODEL, MODEL)

    def reply(self, user: str, messages: list[dict[str, Any]], temperature: float, seed: Any) -> dict[str, Any]:
        if "<passage>" not in user:
            return super().reply(user, messages, temperature, seed)
        zh = any("\u4e00" <= ch <= "\u9fff" for m in messages if m.get("role") == "system" for ch in m["content"])
        return grade_passage(_section(user, "question") or "", _section(user, "passage") or "", "zh" if zh else "en")
