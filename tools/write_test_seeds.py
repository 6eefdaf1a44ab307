"""Write the test fixtures' embedding seeds: ``tests/fixtures/mini_kb/cache/`` and ``tests/fixtures/big_seed/``.

A data folder's ``cache/`` is the sandbox's read-only seed of passage and query embeddings (as the demo's
``weknora_nb/sandbox/demo/cache/``, which ``weknora-nb sandbox build --write-seed`` writes): with these, a test
run embeds (almost) nothing of the fixtures. tests/test_fixture_seeds.py says what each seed holds.

Run it when tests/test_fixture_seeds.py fails: a fixture document or FAQ entry, the chunking or the index texts
changed, or a query was added to ``tests/fixtures/seed_queries.json``. With ``--record`` it first runs the test
files that serve these fixtures (those naming ``mini_kb``, ``MINI`` or ``write_big_documents``) and rewrites
``seed_queries.json`` with every query their sandboxes embed (after adding or changing queries in those tests)::

    .venv/bin/python tools/write_test_seeds.py            # seconds: vectors already in the seeds are kept
    .venv/bin/python tools/write_test_seeds.py --record   # a few minutes: the tests run first
    .venv/bin/python tools/write_test_seeds.py --fresh    # everything embedded again (a new model package)

The script is also the pytest plugin ``--record`` loads (``-p write_test_seeds``): it logs each query to the file
named by ``$WEKNORA_NB_RECORD_QUERIES``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD_ENV = "WEKNORA_NB_RECORD_QUERIES"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true",
                    help="first run the tests serving the fixtures and rewrite tests/fixtures/seed_queries.json")
    ap.add_argument("--fresh", action="store_true", help="embed everything again (ignore the seeds there)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests import test_fixture_seeds as fs
    from weknora_nb.sandbox.embedders import EMBEDDERS, Embedder

    if args.record:
        record(fs.SEED_QUERIES)
    queries = fs.seed_queries()
    with tempfile.TemporaryDirectory() as scratch:
        passages = fs.seed_passages(Path(scratch))
    for seed, folder in fs.SEEDS.items():
        folder.mkdir(parents=True, exist_ok=True)
        for model in EMBEDDERS:
            emb: Embedder = EMBEDDERS[model](None, None if args.fresh else folder)  # the seed's vectors are reused
            wanted = ((passages[seed].get(model, []), False), (queries.get(seed, {}).get(model, []), True))
            for texts, is_query in wanted:
                stale = folder / f"{'queries' if is_query else 'embeddings'}-{model}.npz"
                if not texts:
                    stale.unlink(missing_ok=True)
                    continue
                f = emb.write_seed(list(dict.fromkeys(texts)), folder, queries=is_query)
                f.chmod(0o644)  # as a checkout has it
                print(f"{f.relative_to(ROOT)}: {len(set(texts))} {'queries' if is_query else 'passages'}, "
                      f"{f.stat().st_size} bytes")
    return 0


def record(out: Path) -> None:
    """Run the tests that serve the fixtures with this plugin and write the queries they embedded to ``out``."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if any(s in p.read_text(encoding="utf-8") for s in ("mini_kb", "MINI", "write_big_documents")))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "queries.jsonl"
        env = {**os.environ, RECORD_ENV: str(log), "WEKNORA_API_KEY": os.environ.get("WEKNORA_API_KEY", "x"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tools"), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "pytest", "-p", "write_test_seeds", "-p", "no:cacheprovider", "-q",
               "-n", "auto", "--dist", "loadfile", *files]
        print("recording:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        got: dict[str, dict[str, set[str]]] = {}
        for line in log.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            got.setdefault(r["seed"], {}).setdefault(r["model"], set()).add(r["text"])
    out.write_text(json.dumps({s: {m: sorted(t) for m, t in sorted(by.items())} for s, by in sorted(got.items())},
                              ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}: " + ", ".join(f"{s} {m} {len(t)}" for s, by in got.items()
                                                         for m, t in by.items()))


def pytest_configure(config: Any) -> None:
    """As a pytest plugin: log each query a sandbox over a fixture folder embeds to ``$WEKNORA_NB_RECORD_QUERIES``."""
    del config
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    from tests.test_fixture_seeds import seed_of
    from weknora_nb.sandbox.embedders import Embedder
    from weknora_nb.sandbox.index import SandboxIndex

    def log(emb: Embedder, texts: list[str]) -> None:
        seed = getattr(emb, "_recorded_seed", None)
        if seed is not None:
            with open(path, "a", encoding="utf-8") as f:  # one write a line: xdist workers append to one file
                f.write("".join(json.dumps({"seed": seed, "model": emb.name, "text": t}, ensure_ascii=False) + "\n"
                                for t in texts))

    embedder, query, queries = SandboxIndex.embedder, Embedder.query, Embedder.queries

    def embedder_of(self: SandboxIndex, name: str) -> Embedder:
        emb = embedder(self, name)
        if not hasattr(self, "_recorded_seed"):
            self._recorded_seed = seed_of(self.chunks)  # type: ignore[attr-defined]
        emb._recorded_seed = self._recorded_seed  # type: ignore[attr-defined]
        return emb

    def query_of(self: Embedder, text: str) -> Any:
        log(self, [text])
        return query(self, text)

    def queries_of(self: Embedder, texts: Any) -> Any:
        log(self, list(texts))
        return queries(self, texts)

    SandboxIndex.embedder = embedder_of  # type: ignore[method-assign]
    Embedder.query, Embedder.queries = query_of, queries_of  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main())
