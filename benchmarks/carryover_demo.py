"""Carry the demo test set's labels over to the demo knowledge base re-chunked at other chunk sizes.

Old chunks: the sandbox's default chunking of the demo documents (``chunk_markdown``,
``max_chars`` 420, split at every heading) plus the FAQ entries, as ``chunks.parquet`` inventories.
New chunkings:

- ``half``: the same chunker at ``max_chars`` 210;
- ``double-sandbox``: the same chunker at ``max_chars`` 840. Because it splits at every heading
  and nine sections in ten are shorter than 420 characters, this gives exactly the old chunks
  (the script checks and says so): a re-chunking that changes nothing;
- ``double``: chunks of up to 840 characters that do not stop at headings: consecutive old
  chunks of one document packed together (each keeps its heading line), as a splitter that
  ignores document structure would cut them. FAQ entries stay as they are.

For each, ``carry_over_files`` writes the new test set, its lineage and the review sheet under
``--out``, and the script prints the share of old labels carried automatically, partly and
flagged. Then it draws ``--sample`` carried labels per changed chunking (seed fixed) whose new
chunk's text is not the old chunk's own text (identical text is right by construction), and
``--extra-positive`` more of grade >= 1 from the half-size chunking (where errors matter), and
writes them, with query, reference answer, old and new text, to the check sheet
(``tests/data/carryover-check-<rule>.csv``). A person reads each one and fills ``verdict`` (right /
wrong) and ``reason``; run the script again and it prints the counts from the filled sheet (it
refuses a sheet that does not hold the same sample).

    python benchmarks/carryover_demo.py [--rule strict|lenient] [--out outputs/carryover-demo] [--sample 25]
                                        [--extra-positive 20] [--seed 13]
"""

from __future__ import annotations

import argparse
import csv
import io
import time
from pathlib import Path

import numpy as np
import pandas as pd

from weknora_nb.analysis.carryover import carry_over_files, normalise
from weknora_nb.core.testset import load_testset
from weknora_nb.sandbox.chunking import MAX_CHARS, Chunk, chunk_corpus, load_faq

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "weknora_nb" / "sandbox" / "demo"
CHECKS = ROOT / "tests" / "data"
CHECK_COLUMNS = ["chunking", "query_id", "query", "answer", "new_chunk_id", "grade", "sources", "old_content",
                 "new_content", "verdict", "reason"]


def inventory(chunks: list[Chunk]) -> pd.DataFrame:
    """Chunks in the ``chunks.parquet`` shape."""
    return pd.DataFrame([{"chunk_id": c.id, "knowledge_base_id": "kb-faq" if c.chunk_type == "faq" else "kb-docs",
                          "knowledge_id": c.knowledge_id, "knowledge_title": c.knowledge_title,
                          "chunk_index": c.chunk_index, "chunk_type": c.chunk_type, "is_enabled": True,
                          "content": c.content} for c in chunks])


def packed(frame: pd.DataFrame, limit: int) -> pd.DataFrame:
    """Consecutive chunks of each document packed into chunks of at most ``limit`` characters
    (joined by a blank line), renumbered ``<knowledge_id>:<index:03d>``."""
    rows = []
    for kid, group in frame.groupby("knowledge_id", sort=False):
        packs: list[list[dict]] = []
        for rec in group.sort_values("chunk_index").to_dict("records"):
            size = sum(len(r["content"]) + 2 for r in packs[-1]) if packs else 0
            if packs and size + len(rec["content"]) <= limit:
                packs[-1].append(rec)
            else:
                packs.append([rec])
        for i, pack in enumerate(packs):
            rows.append({**pack[0], "chunk_id": f"{kid}:{i:03d}", "chunk_index": i,
                         "content": "\n\n".join(r["content"] for r in pack)})
    return pd.DataFrame(rows)


def chunkings() -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """The old inventory and the new ones, by name."""
    docs, faq = DEMO / "docs", load_faq(DEMO / "faq" / "faq.jsonl")
    old = inventory(chunk_corpus(docs, max_chars=MAX_CHARS) + faq)
    text = old[old["chunk_type"] == "text"]
    new = {"half": inventory(chunk_corpus(docs, max_chars=MAX_CHARS // 2) + faq),
           "double-sandbox": inventory(chunk_corpus(docs, max_chars=MAX_CHARS * 2) + faq),
           "double": pd.concat([packed(text, MAX_CHARS * 2), old[old["chunk_type"] == "faq"]], ignore_index=True)}
    return old, new


def run(out: Path, rule: str) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, dict]]:
    """Carry over to every new chunking; prints the figures; returns (carried, old, new) per name."""
    old, new = chunkings()
    out.mkdir(parents=True, exist_ok=True)
    old.to_parquet(out / "chunks-default.parquet")
    testset = DEMO / "testset.jsonl"
    outcomes = {}
    for name, inv in new.items():
        path = out / f"chunks-{name}.parquet"
        inv.to_parquet(path)
        same = len(inv) == len(old) and (inv["content"].tolist() == old["content"].tolist())
        t0 = time.perf_counter()
        result, _ = carry_over_files(testset, out / "chunks-default.parquet", path, out / f"testset-{name}.jsonl",
                                     rule=rule)
        seconds = time.perf_counter() - t0
        c = result.counts()
        sh = c["shares"]
        t2 = load_testset(out / f"testset-{name}.jsonl")
        print(f"\n== {name}: {len(inv)} chunks (old {len(old)})" + (" -- identical to the old chunks" if same else ""))
        print(f"old labels {c['old_labels']}: carried automatically {c['carried']} ({sh['carried']:.1%}), "
              f"partly {c['partly']} ({sh['partly']:.1%}), need a person {c['flagged']} ({sh['flagged']:.1%}), "
              f"text gone {c['lost']} ({sh['lost']:.1%})")
        print(f"new labels carried {c['labels_carried']}, (query, new chunk) pairs flagged {c['pairs_flagged']}; "
              f"valid queries {t2.n_valid} of {len(t2)}; {seconds:.1f} s")
        outcomes[name] = (result.carried, old, inv)
    return outcomes


def sample(outcomes: dict, k: int, seed: int, extra_positive: int) -> pd.DataFrame:
    """``k`` carried labels per changed chunking whose new text is not one old chunk's text unchanged, then
    ``extra_positive`` more of grade >= 1 from ``half`` (chunking ``half+``), none drawn twice."""
    ts = {r["query_id"]: r for r in load_testset(DEMO / "testset.jsonl").records()}
    rng = np.random.default_rng(seed)
    rows = []
    for name in ("half", "double"):
        pool, old_text, new_text = _changed(outcomes[name])
        print(f"{name}: {len(pool)} of {len(outcomes[name][0])} carried labels sit on a chunk whose text changed")
        drawn = sorted(rng.choice(len(pool), size=min(k, len(pool)), replace=False))
        if name == "half" and extra_positive:
            rest = [i for i in np.flatnonzero(pool["grade"].to_numpy() >= 1) if i not in set(drawn)]
            more = sorted(rng.choice(rest, size=min(extra_positive, len(rest)), replace=False))
        for label, picks in ((name, drawn), *((("half+", more),) if name == "half" and extra_positive else ())):
            for i in picks:
                r = pool.iloc[i]
                rows.append({"chunking": label, "query_id": r["query_id"], "query": ts[r["query_id"]]["query"],
                             "answer": ts[r["query_id"]].get("answer") or "", "new_chunk_id": r["chunk_id"],
                             "grade": int(r["grade"]), "sources": r["sources"],
                             "old_content": "\n----\n".join(old_text[s] for s in r["source_ids"]),
                             "new_content": new_text[r["chunk_id"]], "verdict": "", "reason": ""})
    return pd.DataFrame(rows, columns=CHECK_COLUMNS)


def _changed(outcome: tuple) -> tuple[pd.DataFrame, dict[str, str], dict[str, str]]:
    """The carried labels whose new chunk's text is not one of its sources' text unchanged."""
    carried, old, new = outcome
    old_text = dict(zip(old["chunk_id"], old["content"], strict=True))
    new_text = dict(zip(new["chunk_id"], new["content"], strict=True))
    carried = carried.assign(source_ids=carried["sources"].str.findall(r"(\S+) \(grade"))
    changed = [normalise(new_text[c]) not in {normalise(old_text[s]) for s in srcs}
               for c, srcs in zip(carried["chunk_id"], carried["source_ids"], strict=True)]
    return carried[changed].reset_index(drop=True), old_text, new_text


def check(drawn: pd.DataFrame, path: Path) -> dict[str, tuple[int, int, int]] | None:
    """Write the sheet to fill (None), or count the verdicts of the filled one: name -> (right, wrong, rows)."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO(newline="")
        drawn.to_csv(buf, index=False, quoting=csv.QUOTE_MINIMAL)
        path.write_text(buf.getvalue(), encoding="utf-8")
        print(f"\nwrote {path}: fill 'verdict' (right/wrong) and 'reason' by reading each, then run again")
        return None
    filled = pd.read_csv(path, dtype=str, keep_default_na=False)
    key = ["chunking", "query_id", "new_chunk_id", "grade"]
    if filled[key].values.tolist() != drawn[key].astype(str).values.tolist():
        raise SystemExit(f"{path} does not hold this sample (seed or rules changed): move it away to redraw")
    print(f"\nchecked by reading ({path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}):")
    random50 = filled[filled["chunking"] != "half+"]
    groups = [*filled.groupby("chunking", sort=False), ("random sample (half + double)", random50)]
    counts = {}
    for name, group in groups:
        v = group["verdict"].str.strip().str.lower()
        right, wrong = int((v == "right").sum()), int((v == "wrong").sum())
        grades = group["grade"]
        by_grade = ", ".join(f"grade {g}: {int((v[grades == g] == 'right').sum())}/{int((grades == g).sum())}"
                             for g in sorted(grades.unique()))
        todo = len(group) - right - wrong
        print(f"  {name}: {right} right, {wrong} wrong of {len(group)} ({by_grade})"
              + (f"; {todo} not checked yet" if todo else ""))
        counts[str(name)] = (right, wrong, len(group))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "carryover-demo")
    ap.add_argument("--sample", type=int, default=25,
                    help="carried labels to check per changed chunking (25 + 25 = 50)")
    ap.add_argument("--extra-positive", type=int, default=20,
                    help="more carried labels of grade >= 1 to check on the half-size chunking")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--rule", default="strict", choices=["strict", "lenient"], help="carry-over rule (default strict)")
    ap.add_argument("--check-sheet", type=Path, default=None,
                    help="verdict sheet (default tests/data/carryover-check-<rule>.csv)")
    args = ap.parse_args()
    print(f"rule: {args.rule}")
    outcomes = run(args.out / args.rule, args.rule)
    print()
    sheet = args.check_sheet or CHECKS / f"carryover-check-{args.rule}.csv"
    check(sample(outcomes, args.sample, args.seed, args.extra_positive), sheet)


if __name__ == "__main__":
    main()
