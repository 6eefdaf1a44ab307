"""Merge the judgments into the demo test set (``data/demo/testset.jsonl``).

Every pooled candidate was judged 0-3 (see JUDGING.md); the test set keeps every judged
chunk with its grade (0 included: judged not relevant), in chunk-id order. Checks:
every worksheet query judged, every candidate graded once, grades 0-3, and the queries
written to have no answer really have no chunk of grade >= 1 (else they stay, valid,
and lose the ``no-answer`` tag, reported).

    python data/demo/labelling/merge_judgments.py
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

from weknora_nb import TestSet

HERE = Path(__file__).resolve().parent


def main() -> None:
    drafts = {}
    for f in sorted((HERE / "drafts").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                d = json.loads(line)
                drafts[d["draft_id"]] = d
    records, problems = [], []
    for sheet in sorted((HERE / "worksheets").glob("*.jsonl")):
        jpath = HERE / "judgments" / sheet.name
        if not jpath.exists():
            problems.append(f"{jpath}: missing")
            continue
        judged = {}
        for n, line in enumerate(jpath.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                j = json.loads(line)
                if j["query_id"] in judged:
                    problems.append(f"{jpath}:{n}: {j['query_id']} judged twice")
                judged[j["query_id"]] = j
        for line in sheet.read_text(encoding="utf-8").splitlines():
            w = json.loads(line)
            j = judged.get(w["query_id"])
            if j is None:
                problems.append(f"{jpath}: {w['query_id']} not judged")
                continue
            want = {c["chunk_id"] for c in w["candidates"]}
            got = j["grades"]
            if set(got) != want:
                problems.append(f"{jpath}: {w['query_id']}: graded {sorted(set(got) ^ want)} wrongly")
                continue
            if any(g not in (0, 1, 2, 3) for g in got.values()):
                problems.append(f"{jpath}: {w['query_id']}: grade outside 0-3")
                continue
            d = drafts[w["draft_id"]]
            tags = list(d.get("tags", []))
            if "no-answer" in tags and any(g >= 1 for g in got.values()):
                print(f"note: {w['query_id']} ({w['draft_id']}) was written as no-answer but has relevant chunks; "
                      "kept as a valid query without the tag")
                tags.remove("no-answer")
            records.append({"query_id": w["query_id"], "query": d["query"],
                            "relevant": {c: got[c] for c in sorted(got)},
                            "query_type": d["query_type"], "tags": tags, "answer": d.get("answer", "")})
    if problems:
        raise SystemExit("\n".join(problems))
    records.sort(key=lambda r: r["query_id"])
    ts = TestSet.from_records(records, source="demo")
    ts.to_jsonl(HERE.parent / "testset.jsonl")
    grades = collections.Counter(g for r in records for g in r["relevant"].values())
    print(f"{len(records)} queries ({ts.n_valid} valid, {len(ts.invalid_ids)} invalid), labels by grade "
          f"{dict(sorted(grades.items()))}, hash {ts.hash}")


if __name__ == "__main__":
    main()
