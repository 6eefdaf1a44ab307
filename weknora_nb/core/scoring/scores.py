"""What :func:`~weknora_nb.core.scoring.score` gives: :class:`Scores` (the tables) and :class:`Counts` (the
test-set and run counts, never hidden), and their output: ``weknora-nb score --json`` (:meth:`Scores.to_json_bytes`)
and the per-query rows written to a file (:meth:`Scores.write_per_query`, ``--per-query-out``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from weknora_nb.core.errors import UsageError, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.metrics import Metric
from weknora_nb.core.scoring.json_rows import float_or_none, json_records, per_query_json, text_or_none
from weknora_nb.core.testset import TestSet

#: :attr:`Counts.incomplete_reason` when there is nothing to score
NO_ROWS = "the results file has no rows"
NO_TESTSET_ROW = "no row belongs to a query of the test set"
NO_VALID_QUERY = "no query of the test set is valid (none has a chunk of grade >= 1)"


@dataclass(frozen=True)
class Counts:
    """Test-set and run counts of one :func:`~weknora_nb.core.scoring.score` call, never hidden.

    Attributes
    ----------
    n_queries, n_valid, n_invalid : int
        Queries in the test set; those with a chunk of grade >= 1 (scored); the others.
    invalid_ids : list of str
        Ids of the invalid queries, in test-set order.
    n_requests : int
        Rows of :attr:`Scores.requests`: every request seen, plus the missing ones.
    n_scored : int
        Requests scored (ok, of a valid query of the test set).
    n_failed : int
        Requests whose status is an error kind; ``failed_by_kind`` maps kind -> count.
    n_skipped : int
        Chat requests whose server skipped retrieval (status ``skipped``: a greeting, chit-chat): not scored, not
        failed, the run stays complete; ``skipped_ids`` lists their query ids (first appearance order).
    n_missing : int
        (valid query, stage, repeat) combinations the run lacks while other queries have them.
    n_unknown_query : int
        Requests naming a query id that the test set does not hold.
    n_duplicates_removed : int
        Repeated chunk ids removed from scored lists (first position kept).
    n_sub_chunks_expanded : int
        Absorbed neighbour chunks placed after their merged result (``sub_chunks="expand"``).
    stages : list of str
        Stages scored, in report order; ``repeats``: the distinct repeat numbers, ascending.
    complete : bool
        Something was scored and nothing is left out: the results have rows, one of them
        at least belongs to a query of the test set, and no request failed, is missing or
        names an unknown query (derived, not passed; :attr:`incomplete_reason` says why not).
    """

    n_queries: int
    n_valid: int
    n_invalid: int
    invalid_ids: list[str]
    n_requests: int
    n_scored: int
    n_failed: int
    failed_by_kind: dict[str, int]
    n_skipped: int
    skipped_ids: list[str]
    n_missing: int
    n_unknown_query: int
    n_duplicates_removed: int
    n_sub_chunks_expanded: int
    stages: list[str]
    repeats: list[int]
    complete: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "complete", self.incomplete_reason is None)

    @property
    def incomplete_reason(self) -> str | None:
        """Why the run is not complete, in plain words (derived from the counts; None when it is):
        ``"the results file has no rows"``, ``"no row belongs to a query of the test set"``, or
        ``"F failed, M missing and U unknown-query requests"``."""
        if self.n_requests == 0:  # every row belongs to a request: no request, no row
            return NO_ROWS
        if self.n_requests - self.n_missing - self.n_unknown_query <= 0:
            return NO_TESTSET_ROW
        if self.n_failed or self.n_missing or self.n_unknown_query:
            return (f"{self.n_failed} failed, {self.n_missing} missing and {self.n_unknown_query} "
                    "unknown-query requests")
        return None

    @property
    def nothing_scored(self) -> str | None:
        """Why no request at all was scored, in plain words, or None when some were: the results have no row
        (:data:`NO_ROWS`), none of a test-set query (:data:`NO_TESTSET_ROW`), no query of the test set is valid
        (:data:`NO_VALID_QUERY`), or every request of a valid query failed, is missing or was skipped by the
        server (a chat that retrieved nothing on purpose)."""
        if self.n_requests == 0:
            return NO_ROWS
        if self.n_requests - self.n_missing - self.n_unknown_query <= 0:
            return NO_TESTSET_ROW
        if self.n_valid == 0:
            return NO_VALID_QUERY
        if self.n_scored == 0:
            kinds = ", ".join(f"{k} {n}" for k, n in self.failed_by_kind.items())
            skipped = f"; {self.n_skipped} skipped by the server" if self.n_skipped else ""
            return (f"every request of a valid query failed or is missing ({self.n_failed} failed"
                    f"{f': {kinds}' if kinds else ''}; {self.n_missing} missing{skipped})")
        return None

    def to_dict(self) -> dict:
        """Every field by name, in the order above (a deep copy: plain lists and dicts)."""
        return {f.name: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                for f in fields(self) for v in [getattr(self, f.name)]}   # the values hold no deeper container


@dataclass
class Scores:
    """Everything :func:`~weknora_nb.core.scoring.score` computed.

    Attributes
    ----------
    metrics : list of Metric
    per_query : DataFrame
        One row per scored request: ``query_id``, ``stage``, ``repeat``, one column per
        metric (values in [0, 1]), ``n_returned`` (after duplicate removal),
        ``n_duplicates``, and ``latency_ms`` when the results carry it.
    requests : DataFrame
        Every request seen or expected: ``query_id``, ``stage``, ``repeat``, ``status``
        (``ok``, an error kind, or ``missing``), ``scored`` (bool), ``reason`` when not
        scored, ``n_returned``, ``n_duplicates``, ``latency_ms``.
    excluded : DataFrame
        ``query_id``, ``stage``, ``repeat``, ``reason``: invalid queries (stage and
        repeat empty), failed, missing and unknown-query requests.
    by_repeat : DataFrame
        Means per (stage, repeat): ``stage``, ``repeat``, ``n_scored``, one column per metric.
    summary : DataFrame
        Long format, one row per (stage, metric): ``mean`` (mean over queries of each query's mean over
        its scored repeats), ``std`` / ``min`` / ``max`` of the per-repeat means, ``n_repeats``,
        ``n_queries``, ``tier``.
    counts : Counts
        Test-set and run counts, never hidden.
    warnings : list of str
        Plain-words warnings every report must show.
    """

    metrics: list[Metric]
    per_query: pd.DataFrame
    requests: pd.DataFrame
    excluded: pd.DataFrame
    by_repeat: pd.DataFrame
    summary: pd.DataFrame
    counts: Counts
    testset: TestSet = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    domain_adjustment: float = 0.0

    @property
    def testset_hash(self) -> str:
        """Content hash of the test set scored against (computed when first asked for)."""
        return self.testset.hash

    @property
    def metric_names(self) -> list[str]:
        """Canonical names of the metrics, in the order asked."""
        return [m.name for m in self.metrics]

    @property
    def stages(self) -> list[str]:
        """Stages of the summary, in report order."""
        return list(dict.fromkeys(self.summary["stage"]))

    @property
    def all_stages(self) -> list[str]:
        """Every stage the results hold: those scored (in report order), then those with no scored request (every
        request failed, or nothing could be scored at all: :attr:`Counts.nothing_scored`)."""
        return list(dict.fromkeys([*self.stages, *map(str, self.counts.stages),
                                   *self.requests["stage"].astype(str)]))

    def failed_stages(self) -> dict[str, dict[str, int]]:
        """Each stage none of whose requests succeeded -> its requests by status (``{"timeout": 12}``), in the
        order of :attr:`Counts.stages`, then of the requests table. Such a stage has no figure."""
        status = self.requests["status"].astype(str)
        stage = self.requests["stage"].astype(str)
        out: dict[str, dict[str, int]] = {}
        for name in dict.fromkeys([*map(str, self.counts.stages), *stage]):
            mine = status[stage == name]
            if len(mine) and not (mine == "ok").any():
                out[name] = {str(k): int(n) for k, n in mine.value_counts().items()}
        return out

    @property
    def complete(self) -> bool:
        """False when nothing was scored (no row, no row of a test-set query) or any request failed,
        is missing, or names an unknown query (:attr:`Counts.incomplete_reason` says which)."""
        return self.counts.complete

    def summary_wide(self, value: str = "mean") -> pd.DataFrame:
        """Stages as rows, metrics as columns (in the order asked)."""
        wide = self.summary.pivot(index="stage", columns="metric", values=value)
        return wide.reindex(index=self.stages, columns=self.metric_names)

    def per_query_mean(self) -> pd.DataFrame:
        """Per (query, stage): each metric averaged over the query's scored repeats (``n_repeats``), in the
        order the pairs first appear."""
        cols = self.metric_names
        if self.per_query["repeat"].nunique() <= 1:   # one repeat: one row per (query, stage), its own mean
            out = self.per_query[["query_id", "stage", *cols]].reset_index(drop=True)
            out["n_repeats"] = np.ones(len(out), np.int64)
            return out
        g = self.per_query.groupby(["query_id", "stage"], sort=False, observed=True)
        out = g[cols].mean()
        out["n_repeats"] = g.size()
        return out.reset_index()

    def to_json_bytes(self, *, per_query: bool = True, indent: bool = True) -> bytes:
        """:meth:`to_json_dict` as UTF-8 JSON text (orjson; ``indent``: two spaces, as ``json.dumps(indent=2)``).
        The per-query rows, most of the text, are written as Arrow strings, never as Python dicts."""
        return b"".join(self.json_pieces(per_query=per_query, indent=indent))

    def json_pieces(self, *, per_query: bool = True, indent: bool = True) -> list[bytes | memoryview]:
        """:meth:`to_json_bytes` in pieces, to be written one after another (``writelines``): the per-query
        rows are not copied once more into one text."""
        import orjson

        head = orjson.dumps(self.to_json_dict(per_query=False), option=orjson.OPT_INDENT_2 if indent else 0)
        if not per_query:
            return [head]
        rows = per_query_json(self.per_query_mean(), self.metric_names, indent=indent)
        if indent:   # the head ends with "\n}"
            return [memoryview(head)[:-2], b',\n  "per_query": ', *rows, b"\n}"]
        return [memoryview(head)[:-1], b',"per_query":', *rows, b"}"]

    def write_per_query(self, path: str | os.PathLike) -> Path:
        """Write :meth:`per_query_mean` to ``path`` (atomically), the format following the suffix
        (:data:`PER_QUERY_FORMATS`): Parquet, CSV, or JSONL (the ``--json`` rows, one a line)."""
        fmt = per_query_format(path)
        table = self.per_query_mean()
        p = Path(path)
        with writing(p), atomic_path(p) as tmp:
            if fmt == "parquet":
                pq.write_table(pa.Table.from_pandas(table, preserve_index=False), tmp)
            elif fmt == "csv":
                table.to_csv(tmp, index=False, encoding="utf-8")
            else:
                with open(tmp, "wb") as fh:
                    fh.writelines(per_query_json(table, self.metric_names, indent=False, lines=True))
        return p

    def to_json_dict(self, *, per_query: bool = True) -> dict:
        """The ``weknora-nb score --json`` object.

        ``summary`` and ``tiers`` are always keyed by stage, then metric
        (``{"final": {"ndcg@5": 0.71}}``), whatever the number of stages; ``spread`` is
        keyed ``"stage/metric"``.
        """
        cells = {(r.stage, r.metric): r for r in self.summary.itertuples()}   # stages x metrics: a few dozen
        stages, names = self.stages, self.metric_names
        num, text = float_or_none, text_or_none
        out = {
            "summary": {s: {m: num(cells[s, m].mean) if (s, m) in cells else None for m in names} for s in stages},
            "tiers": {s: {m: text(cells[s, m].tier) if (s, m) in cells else None for m in names} for s in stages},
            "spread": {f"{r.stage}/{r.metric}": {"std": num(r.std), "min": num(r.min), "max": num(r.max)}
                       for r in self.summary.itertuples()},
            "counts": self.counts.to_dict(),
            "complete": self.complete,
            "incomplete_reason": self.counts.incomplete_reason,
            "warnings": self.warnings,
            "testset_hash": self.testset_hash,
            "domain_adjustment": self.domain_adjustment,
            "excluded": json_records(self.excluded, ints=("repeat",)),
        }
        if per_query:
            out["per_query"] = json_records(self.per_query_mean()[["query_id", "stage", "n_repeats", *names]],
                                             ints=("n_repeats",))
        return out


#: suffix -> format of :meth:`Scores.write_per_query`
PER_QUERY_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def per_query_format(path: str | os.PathLike) -> str:
    """The format :meth:`Scores.write_per_query` writes ``path`` in; UsageError for another suffix."""
    fmt = PER_QUERY_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise UsageError(argument="--per-query-out", allowed="a path ending in " + ", ".join(PER_QUERY_FORMATS),
                         got=str(path))
    return fmt
