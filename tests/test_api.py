"""The package's public surface."""

import subprocess
import sys

import weknora_nb


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(weknora_nb) if not n.startswith("_")}
    assert set(weknora_nb.__all__) == public | {"__version__"}
    assert set(weknora_nb.__all__) == {*weknora_nb._EXPORTS, *weknora_nb._MODULES, "__version__"}
    for name in weknora_nb.__all__:
        assert getattr(weknora_nb, name) is not None


def test_import_is_light():
    """``import weknora_nb`` loads no HTTP, table or plotting library (the CLI starts fast)."""
    code = ("import sys, weknora_nb; heavy = {'httpx', 'pandas', 'pyarrow', 'matplotlib', 'numpy'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_public_names_score_a_run_end_to_end(tmp_path):
    """The namespace is enough to score: the example test set and results, read, scored, written back."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "data" / "examples"
    ts = weknora_nb.load_testset(examples / "testset.jsonl")
    results = weknora_nb.read_results(examples / "results.jsonl")
    scores = weknora_nb.score(ts, results, ["ndcg@5", "recall@10"])
    assert set(scores.summary["metric"]) == {"ndcg@5", "recall@10"}
    again = weknora_nb.score_files(examples / "testset.jsonl", examples / "results.jsonl", ["ndcg@5", "recall@10"])
    assert again.summary.equals(scores.summary)
    assert weknora_nb.tier("ndcg@5", 0.9) == "excellent"
    assert callable(weknora_nb.run_checks) and callable(weknora_nb.render_report)
    from weknora_nb.collect import collect

    assert callable(collect)
