"""Pool the chunks that need judging (docs/method.md §10).

TREC-style pooling: per query of the test set, the union of the top-``depth`` distinct chunks
of every stage of every run (merged results unfolded as scoring unfolds them; every repeat of
a request counts; failed requests give nothing) that carry no label yet (grade 0 is a label).
Each pooled chunk comes with its text from the runs' chunk inventories (``chunks.parquet``;
a chunk none of them lists is pooled with empty text and a note), where it was found
(``run/stage@rank``, rank among the distinct chunks of the list) and its best rank.

The pooled chunks are the rows of the worksheet people judge them in (:mod:`weknora_nb.analysis.worksheet`:
its columns, writing it, reading it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from weknora_nb.analysis.worksheet import WORKSHEET_COLUMNS, blank
from weknora_nb.core.errors import InputError, NotComparableError, RunFolderError, UsageError, reading

if TYPE_CHECKING:
    import pandas as pd

    from weknora_nb.core.testset import TestSet

NO_TEXT = "not in any run's chunk inventory (chunks.parquet): its text is unknown"


@dataclass
class Pool:
    """The pooled chunks of a test set and the runs' label coverage.

    ``rows``: one row per (query, chunk) to judge, :data:`WORKSHEET_COLUMNS`, ordered by the
    query's place in the test set, then best rank. ``coverage``: per run and stage, the
    (query, chunk) entries of its top ``depth`` (``in_top``), how many carry a label already
    and their share.
    """

    rows: pd.DataFrame
    coverage: pd.DataFrame
    depth: int
    n_queries: int
    n_failed_requests: int
    n_unknown_queries: int

    @property
    def n_pooled(self) -> int:
        return len(self.rows)

    def describe(self) -> str:
        """The summary the CLI prints."""
        no_text = int((self.rows["note"] == NO_TEXT).sum())
        queries = self.rows["query_id"].nunique()
        lines = [f"{self.n_queries} queries, {self.n_pooled} chunks to judge for {queries} of them "
                 f"(top {self.depth} of every stage of every run, labelled ones left out)"]
        if no_text:
            lines.append(f"{no_text} pooled chunks are in no run's chunk inventory: pooled with empty text")
        if self.n_failed_requests:
            lines.append(f"{self.n_failed_requests} failed requests contributed nothing")
        if self.n_unknown_queries:
            lines.append(f"{self.n_unknown_queries} query ids of the runs are not in the test set: left out")
        lines.append(f"already labelled in each top {self.depth}:")
        for r in self.coverage.itertuples(index=False):
            share = "-" if r.in_top == 0 else f"{r.share:.0%}"
            lines.append(f"  {r.run}/{r.stage}: {share} ({r.labelled} of {r.in_top})")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# pooling
# ---------------------------------------------------------------------------------------
def pool(testset: TestSet | str | Path, runs: Sequence[str | Path], *, depth: int = 10,
         assessor: str | None = None, stages: Sequence[str] | None = None, with_labelled: bool = False) -> Pool:
    """Pool the unlabelled top-``depth`` chunks of ``runs`` (run folders) for ``testset``.

    ``stages``: only these stages' lists (default every stage); ``with_labelled``: the labelled chunks of the pool
    are rows too, with the column ``labelled`` telling them apart (what grading a calibration sample needs)."""
    import pandas as pd

    from weknora_nb.core.testset import load_testset

    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise UsageError(argument="--depth", allowed="an integer >= 1", got=depth)
    if not runs:
        raise UsageError(argument="--runs", allowed="one or more run folders", got=[])
    ts = testset if not isinstance(testset, (str, Path)) else load_testset(testset)
    query_ids = list(ts.queries["query_id"])
    known = set(query_ids)
    named = _run_names(runs)
    tops: list[pd.DataFrame] = []
    texts: dict[str, tuple[str, str]] = {}
    failed = unknown = 0
    for name, folder in named:
        top, n_failed, n_unknown = _top_chunks(folder, known, depth)
        if top.empty and n_unknown:
            raise NotComparableError(f"--runs: {folder} holds no query of the test set "
                                     f"{testset if isinstance(testset, (str, Path)) else 'given'} (its {n_unknown} "
                                     "queries are others): it was collected with another test set")
        failed, unknown = failed + n_failed, unknown + n_unknown
        tops.append(top.assign(run=name))
        for cid, text in _inventory(folder).items():
            texts.setdefault(cid, text)
    top = pd.concat(tops, ignore_index=True)
    if stages is not None:
        have = sorted(set(top["stage"].astype(str)))
        if not stages or set(stages) - set(have):
            raise UsageError(argument="--stage", allowed=have, got=list(stages))
        top = top[top["stage"].isin(list(stages))].reset_index(drop=True)
    labelled = set(zip(ts.qrels["query_id"], ts.qrels["chunk_id"], strict=True))
    top["labelled"] = [(q, c) in labelled for q, c in zip(top["query_id"], top["chunk_id"], strict=True)]
    coverage = _coverage(top, [n for n, _ in named])
    rows = _pooled_rows(top if with_labelled else top[~top["labelled"]], ts, query_ids, texts, assessor)
    if with_labelled:
        rows["labelled"] = [(q, c) in labelled for q, c in zip(rows["query_id"], rows["chunk_id"], strict=True)]
    return Pool(rows, coverage, depth, len(ts), failed, unknown)


def _run_names(runs: Sequence[str | Path]) -> list[tuple[str, Path]]:
    """(name, folder) per run: the manifest's run name (else the folder name), made unique."""
    from weknora_nb.core.run import read_manifest

    out: list[tuple[str, Path]] = []
    seen: dict[str, int] = {}
    for r in runs:
        p = Path(r)
        try:
            manifest = read_manifest(p)
        except RunFolderError as exc:
            raise RunFolderError(f"--runs: {exc}") from None
        name = str(manifest.get("run_name") or p.name)
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name}#{seen[name]}", p))
    return out


def _top_chunks(folder: Path, known: set[str], depth: int) -> tuple[pd.DataFrame, int, int]:
    """(query_id, stage, chunk_id, rank) of the top ``depth`` distinct chunks of each request of a run,
    best rank over its repeats; plus the number of failed requests and of rows of unknown queries."""
    from weknora_nb.core.results import read_results
    from weknora_nb.core.run import RESULTS
    from weknora_nb.core.unfold import expand_sub_chunks

    if not (folder / RESULTS).is_file():
        raise RunFolderError(f"--runs: {folder} holds no {RESULTS}: the collection has not finished")
    df, _ = expand_sub_chunks(read_results(folder / RESULTS))
    df = df[["query_id", "stage", "repeat", "rank", "chunk_id", "status"]].astype(
        {"query_id": "string", "stage": "string", "chunk_id": "string", "status": "string"})
    ok = df["status"] == "ok"
    failed = int(df.loc[~ok, ["query_id", "stage", "repeat"]].drop_duplicates().shape[0])
    df = df[ok & df["chunk_id"].notna() & df["rank"].notna()]
    is_known = df["query_id"].isin(known)
    unknown = int(df.loc[~is_known, "query_id"].nunique())
    df = df[is_known].sort_values(["query_id", "stage", "repeat", "rank"], kind="stable")
    df = df.drop_duplicates(["query_id", "stage", "repeat", "chunk_id"], keep="first")
    df = df.assign(rank=df.groupby(["query_id", "stage", "repeat"], sort=False).cumcount() + 1)
    df = df[df["rank"] <= depth]
    top = df.groupby(["query_id", "stage", "chunk_id"], sort=False, observed=True)["rank"].min().reset_index()
    return top[["query_id", "stage", "chunk_id", "rank"]], failed, unknown


def _inventory(folder: Path) -> dict[str, tuple[str, str]]:
    """chunk id -> (knowledge title, content) from a run's ``chunks.parquet`` ({} when it has none)."""
    import pandas as pd

    from weknora_nb.core.run import CHUNKS

    p = folder / CHUNKS
    if not p.is_file():
        return {}
    with reading(p):
        inv = pd.read_parquet(p)
    missing = [c for c in ("chunk_id", "content") if c not in inv.columns]
    if missing:
        raise InputError(p, f"a chunk inventory needs the column(s) {missing}")
    titles = inv["knowledge_title"] if "knowledge_title" in inv.columns else [""] * len(inv)
    return {str(c): ("" if blank(t) else str(t), "" if blank(x) else str(x))
            for c, t, x in zip(inv["chunk_id"], titles, inv["content"], strict=True) if not blank(c)}


def _coverage(top: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Per run and stage: entries of the top ``depth``, how many are labelled, the share."""
    import pandas as pd

    cov = top.groupby(["run", "stage"], sort=False, observed=True)["labelled"].agg(["size", "sum"]).reset_index()
    cov.columns = ["run", "stage", "in_top", "labelled"]
    cov["share"] = cov["labelled"] / cov["in_top"].where(cov["in_top"] > 0)
    order = {n: i for i, n in enumerate(names)}
    cov = cov.sort_values(["run", "stage"], key=lambda s: s.map(order) if s.name == "run" else s, kind="stable")
    return pd.DataFrame(cov).reset_index(drop=True).astype({"in_top": int, "labelled": int})


def _pooled_rows(unlabelled: pd.DataFrame, ts: TestSet, query_ids: list[str],
                 texts: dict[str, tuple[str, str]], assessor: str | None) -> pd.DataFrame:
    """The worksheet rows of the unlabelled entries: one per (query, chunk)."""
    import pandas as pd

    texts_of = dict(zip(ts.queries["query_id"], ts.queries["query"], strict=True))
    place = {q: i for i, q in enumerate(query_ids)}
    found: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for q, c, stage, run, rank in unlabelled[["query_id", "chunk_id", "stage", "run", "rank"]].itertuples(index=False):
        found.setdefault((str(q), str(c)), []).append((int(rank), f"{run}/{stage}@{int(rank)}"))
    rows = []
    for (q, c), where in found.items():
        where.sort()
        title, content = texts.get(c, ("", ""))
        rows.append({"query_id": q, "query": texts_of[q], "chunk_id": c, "knowledge_title": title,
                     "content": content, "found_in": "; ".join(w for _, w in where), "best_rank": where[0][0],
                     "grade": None, "assessor": assessor or "", "note": "" if c in texts else NO_TEXT})
    frame = pd.DataFrame(rows, columns=list(WORKSHEET_COLUMNS))
    if frame.empty:
        return frame
    frame["_place"] = frame["query_id"].map(place)
    frame = frame.sort_values(["_place", "best_rank", "chunk_id"], kind="stable").drop(columns="_place")
    return frame.reset_index(drop=True).astype({"best_rank": "Int64", "grade": "Int64"})

