"""The suite's two tiers: `make test` draws every property test's examples, `make test-fast` a share of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import example_share, examples

ROOT = Path(__file__).resolve().parents[1]


def test_every_example_is_drawn_unless_a_share_is_asked_for(monkeypatch):
    monkeypatch.delenv("WEKNORA_NB_EXAMPLES", raising=False)
    assert [examples(n) for n in (5, 25, 60, 150)] == [5, 25, 60, 150]
    monkeypatch.setenv("WEKNORA_NB_EXAMPLES", "0.25")
    assert [examples(n) for n in (5, 25, 60, 150)] == [5, 10, 15, 38]   # at least 10, never more than written
    monkeypatch.setenv("WEKNORA_NB_EXAMPLES", "1")
    assert examples(150) == 150


@pytest.mark.parametrize("text", ["0", "-0.5", "1.5", "nan", "inf", "a quarter", ""])
def test_a_share_outside_0_to_1_stops_the_run_with_what_arrived(monkeypatch, text):
    monkeypatch.setenv("WEKNORA_NB_EXAMPLES", text)
    with pytest.raises(pytest.UsageError, match=re.escape(f"a number in (0, 1] is allowed, got {text!r}")):
        example_share()


def test_make_test_draws_everything_and_test_fast_the_makefile_share():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipes = dict(re.findall(r"^([\w-]+):[^\n]*\n\t([^\n]+)", makefile, flags=re.M))
    assert "WEKNORA_NB_EXAMPLES=1 " in recipes["test"]
    assert "WEKNORA_NB_EXAMPLES=$${WEKNORA_NB_EXAMPLES:-$(FAST_EXAMPLES)}" in recipes["test-fast"]
    share = re.search(r"^FAST_EXAMPLES := (\S+)$", makefile, flags=re.M)
    assert share is not None and 0 < float(share.group(1)) < 1
