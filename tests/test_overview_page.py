"""The top index (reports/overview_page.py): runs grouped by test set, figures with tiers as words, the comparison
in words, everything escaped."""

from __future__ import annotations

import re

from weknora_nb.reports.index_page import write_overview
from weknora_nb.reports.overview_page import comparison_words
from weknora_nb.reports.report import Report


def report(root, name: str, ts: str, **extra) -> Report:
    folder = root / name
    folder.mkdir()
    head = {"stage": "final", "metrics": [("ndcg@5", 0.556, "pass"), ("recall@10", 0.703, None)],
            "baselines": 0, "testset": {"name": f"{ts}.jsonl", "n_queries": 40, "hash": f"sha256:{ts}"},
            "date": "2026-12-07", "status": "complete", **extra}
    return Report(name, folder, folder / "index.html", headline=head)


def test_runs_are_grouped_by_test_set_with_tiers_as_words_and_the_comparison_in_words(tmp_path):
    vs = {"metric": "ndcg@5", "baseline": "base<1>", "delta": 0.199, "ci": (0.108, 0.286), "p_holm": 0.004}
    reps = [report(tmp_path, "base", "main"), report(tmp_path, "faq", "faq"),
            report(tmp_path, "re<b>", "main", vs=vs, baselines=1)]
    page = write_overview(reps, tmp_path / "index.html").read_text(encoding="utf-8")
    assert page.count("<h2>Test set ") == 2 and page.index("main.jsonl") < page.index("faq.jsonl")
    assert re.search(r'<a href="re%3Cb%3E/index.html">re&lt;b&gt;</a></td>.*NDCG@5 vs base&lt;1&gt;: \+0\.199 '
                     r"\[\+0\.108, \+0\.286\], significant", page)
    assert '<td class="pass">0.556 pass</td>' in page and '<td class="">0.703</td>' in page   # no tier, no word
    assert "no baseline given" in page and "<b>" not in page
    assert comparison_words({**vs, "ci": (-0.01, 0.2)}).endswith(", not significant")
