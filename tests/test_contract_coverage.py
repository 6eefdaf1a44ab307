"""Every fact of docs/weknora-contract.md is held by a test, or listed there as not emulated (with why)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "weknora-contract.md"


def _ids(text: str) -> set[str]:
    """Fact ids named in ``text`` (``C15``, and ranges written ``C70-C75``)."""
    out = set(re.findall(r"\bC\d+\b", text))
    for lo, hi in re.findall(r"\bC(\d+)-C(\d+)\b", text):
        out |= {f"C{i}" for i in range(int(lo), int(hi) + 1)}
    return out


def _facts() -> set[str]:
    return set(re.findall(r"^- \*\*(C\d+)\*\*", CONTRACT.read_text(encoding="utf-8"), flags=re.M))


def _not_emulated() -> set[str]:
    """The ids in the first column of the 'not emulated' table."""
    text = CONTRACT.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (C[\dC, -]+) \| [^|]+\|$", text, flags=re.M)
    return set().union(*(_ids(r) for r in rows)) if rows else set()


def _tested() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for args in re.findall(r"contract\(([^)]*)\)", path.read_text(encoding="utf-8")):
            found |= _ids(args)
    return found


def test_the_contract_numbers_its_facts_without_gaps():
    facts = sorted(int(i[1:]) for i in _facts())
    assert facts == list(range(1, len(facts) + 1)) and len(facts) >= 80


def test_every_fact_is_held_by_a_test_or_said_not_emulated():
    facts, tested, skipped = _facts(), _tested(), _not_emulated()
    assert skipped <= facts
    missing = sorted(facts - tested - skipped, key=lambda i: int(i[1:]))
    assert not missing, f"facts with no test and no reason: {missing}"


def test_a_fact_said_not_emulated_has_no_test_claiming_it():
    both = sorted(_tested() & _not_emulated(), key=lambda i: int(i[1:]))
    assert not both, f"listed as not emulated but marked by a test: {both}"
