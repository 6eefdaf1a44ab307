"""Pool the chunks that need judging, and the worksheet people judge them in (docs/method.md §10).

TREC-style pooling: per query of the test set, the union of the top-``depth`` distinct chunks
of every stage of every run (merged results unfolded as scoring unfolds them; every repeat of
a request counts; failed requests give nothing) that carry no label yet (grade 0 is a label).
Each pooled chunk comes with its text from the runs' chunk inventories (``chunks.parquet``;
a chunk none of them lists is pooled with empty text and a note), where it was found
(``run/stage@rank``, rank among the distinct chunks of the list) and its best rank.

The worksheet (:func:`write_worksheet`) is a CSV in UTF-8 with a BOM, so that Excel shows
Chinese right, or an XLSX file (openpyxl), with the columns :data:`WORKSHEET_COLUMNS`.
People fill ``grade`` (0-3; blank = not judged) and ``assessor``; :func:`read_worksheet`
turns the filled sheet back into judgements for ``testset merge-labels`` and ``testset agreement``.
A cell a spreadsheet would run as a formula (text starting with ``=``, ``+``, ``-``, ``@``) is
written with a leading ``'`` in a CSV and as a text cell in an XLSX, so chunk text never
executes; reading takes the ``'`` off again.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import InputError, Problem, RunFolderError, UsageError, reading, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.labels import GRADES, Judgement, read_labels
from weknora_nb.core.lineage import LabelFile, read_label_file

if TYPE_CHECKING:
    import pandas as pd

    from weknora_nb.core.testset import TestSet

__all__ = ["WORKSHEET_COLUMNS", "Pool", "pool", "write_worksheet", "read_worksheet", "read_worksheet_entries",
           "read_judgements", "label_file"]

log = logging.getLogger(__name__)

WORKSHEET_COLUMNS = ("query_id", "query", "chunk_id", "knowledge_title", "content", "found_in", "best_rank",
                     "grade", "assessor", "note")
NO_TEXT = "not in any run's chunk inventory (chunks.parquet): its text is unknown"
#: first characters that make a spreadsheet read a cell as a formula
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


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
         assessor: str | None = None) -> Pool:
    """Pool the unlabelled top-``depth`` chunks of ``runs`` (run folders) for ``testset``."""
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
        failed, unknown = failed + n_failed, unknown + n_unknown
        tops.append(top.assign(run=name))
        for cid, text in _inventory(folder).items():
            texts.setdefault(cid, text)
    top = pd.concat(tops, ignore_index=True)
    labelled = set(zip(ts.qrels["query_id"], ts.qrels["chunk_id"], strict=True))
    top["labelled"] = [(q, c) in labelled for q, c in zip(top["query_id"], top["chunk_id"], strict=True)]
    coverage = _coverage(top, [n for n, _ in named])
    rows = _pooled_rows(top[~top["labelled"]], ts, query_ids, texts, assessor)
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
    from weknora_nb.core.results import expand_sub_chunks, read_results
    from weknora_nb.core.run import RESULTS

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
    return top, failed, unknown


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
    return {str(c): ("" if _blank(t) else str(t), "" if _blank(x) else str(x))
            for c, t, x in zip(inv["chunk_id"], titles, inv["content"], strict=True) if not _blank(c)}


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) in ("", "<NA>", "nan")


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


# ---------------------------------------------------------------------------------------
# the worksheet
# ---------------------------------------------------------------------------------------
def _cell_text(value: Any) -> str:
    """A cell's text: blanks for missing values, integers without ``.0``."""
    if _blank(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _defused(text: str) -> str:
    """``text`` with a leading ``'`` when a spreadsheet would read it as a formula."""
    return "'" + text if text.startswith(_FORMULA_START) else text


def write_worksheet(rows: pd.DataFrame, path: str | Path) -> Path:
    """Write worksheet rows (:data:`WORKSHEET_COLUMNS` first, then any others) as CSV (UTF-8 with a
    BOM) or, for a path ending in ``.xlsx``, as an Excel workbook; atomically."""
    p = Path(path)
    columns = list(WORKSHEET_COLUMNS) + [c for c in rows.columns if c not in WORKSHEET_COLUMNS]
    table = [[_cell_text(v) for v in rec] for rec in rows.reindex(columns=columns).itertuples(index=False)]
    with writing(p), atomic_path(p) as tmp:
        if p.suffix.lower() == ".xlsx":
            _write_xlsx(tmp, columns, table)
        else:
            buf = io.StringIO(newline="")
            w = csv.writer(buf)
            w.writerow(columns)
            w.writerows([[_defused(v) for v in rec] for rec in table])
            tmp.write_bytes(buf.getvalue().encode("utf-8-sig"))
    return p


def _write_xlsx(path: Path, columns: list[str], table: list[list[str]]) -> None:
    """One sheet, a bold frozen header, every cell text (never a formula), long text wrapped."""
    from openpyxl import Workbook
    from openpyxl.cell.cell import ILLEGAL_CHARACTERS_RE
    from openpyxl.styles import Alignment, Font

    wb = Workbook()
    ws = wb.active
    ws.title = "judging"
    ws.append(columns)
    for cell in ws[1]:
        cell.font = Font(bold=True)
    wrap = Alignment(wrap_text=True, vertical="top")
    for r, rec in enumerate(table, start=2):
        for c, value in enumerate(rec, start=1):
            if value == "":
                continue
            cell = ws.cell(row=r, column=c)
            if columns[c - 1] in ("best_rank", "grade") and value.isdigit():
                cell.value = int(value)
                continue
            cell.value = ILLEGAL_CHARACTERS_RE.sub("", value)
            cell.data_type = "s"
            if columns[c - 1] in ("query", "content", "old_content"):
                cell.alignment = wrap
    widths = {"query": 40, "content": 80, "old_content": 80, "found_in": 30, "knowledge_title": 24}
    for c, name in enumerate(columns, start=1):
        ws.column_dimensions[ws.cell(row=1, column=c).column_letter].width = widths.get(name, 14)
    ws.freeze_panes = "A2"
    wb.save(path)


def read_worksheet(path: str | Path, assessor: str | None = None) -> list[Judgement]:
    """The judgements of a filled worksheet (CSV or XLSX): one per row with a grade; a blank grade
    is not judged and gives nothing. ``assessor`` fills rows whose assessor cell is blank.

    Raises :class:`InputError` naming file, row (as a spreadsheet numbers it: the header is row 1)
    and field of every bad row: a grade that is not 0-3, a missing query or chunk id, no assessor.
    """
    return [j for _, j in read_worksheet_entries(path, assessor)]


def read_worksheet_entries(path: str | Path, assessor: str | None = None) -> list[tuple[int, Judgement]]:
    """(row, judgement) of every graded row of a worksheet (see :func:`read_worksheet`)."""
    p = Path(path)
    with reading(p):
        header, records = _xlsx_rows(p) if p.suffix.lower() == ".xlsx" else _csv_rows(p)
    missing = [c for c in ("query_id", "chunk_id", "grade") if c not in header]
    if missing:
        raise InputError(p, [Problem(str(p), 1, None, f"missing column(s) {missing} in the header", "row")])
    if "assessor" not in header and not assessor:
        raise InputError(p, [Problem(str(p), 1, None, "no assessor column: add one or pass the assessor "
                                                       "(--assessor)", "row")])
    at = datetime.fromtimestamp(p.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    problems: list[Problem] = []
    out: list[tuple[int, Judgement]] = []
    for row, rec in records:
        cells = {name: _undefused(_cell_text(rec[i] if i < len(rec) else None)).strip()
                 for i, name in enumerate(header)}
        j = _judgement(cells, str(p), row, assessor, at, problems)
        if j is not None:
            out.append((row, j))
    if problems:
        raise InputError(p, problems)
    return out


def _judgement(cells: dict[str, str], path: str, row: int, assessor: str | None, at: str,
               problems: list[Problem]) -> Judgement | None:
    """The judgement of one worksheet row; None for a row without a grade (problems appended)."""
    if not cells.get("grade"):
        return None
    grade = _grade(cells["grade"])
    n_before = len(problems)
    if grade is None:
        problems.append(Problem(path, row, "grade", f"must be 0, 1, 2 or 3 (blank: not judged), got "
                                                    f"{cells['grade']!r}", "row"))
    for name in ("query_id", "chunk_id"):
        if not cells.get(name):
            problems.append(Problem(path, row, name, "must not be empty on a graded row", "row"))
    who = cells.get("assessor") or (assessor or "").strip()
    if not who:
        problems.append(Problem(path, row, "assessor", "empty: fill it or pass the assessor (--assessor)", "row"))
    if len(problems) > n_before:
        return None
    return Judgement(cells["query_id"], cells["chunk_id"], grade, who, cells.get("at") or at)


def _grade(text: str) -> int | None:
    """``"2"``, ``"2.0"`` -> 2; anything else (``"4"``, ``"2.5"``, ``"high"``) -> None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() and int(value) in GRADES else None


def _undefused(text: str) -> str:
    return text[1:] if text.startswith("'") and text[1:].startswith(_FORMULA_START) else text


def _csv_rows(p: Path) -> tuple[list[str], Iterable[tuple[int, list[str]]]]:
    """The header and (spreadsheet row, cells) of a CSV worksheet (a BOM tolerated)."""
    rows = list(csv.reader(io.StringIO(p.read_bytes().decode("utf-8-sig"), newline="")))
    if not rows:
        raise InputError(p, "the worksheet is empty (no header row)")
    header = [h.strip() for h in rows[0]]
    return header, [(i, r) for i, r in enumerate(rows[1:], start=2) if any(c.strip() for c in r)]


def _xlsx_rows(p: Path) -> tuple[list[str], Iterable[tuple[int, list[Any]]]]:
    """The header and (row, cells) of the first sheet of an XLSX worksheet."""
    from openpyxl import load_workbook

    wb = load_workbook(p, read_only=True, data_only=True)
    try:
        rows = [list(r) for r in wb.worksheets[0].iter_rows(values_only=True)]
    finally:
        wb.close()
    if not rows:
        raise InputError(p, "the worksheet is empty (no header row)")
    header = [_cell_text(h).strip() for h in rows[0]]
    return header, [(i, r) for i, r in enumerate(rows[1:], start=2) if any(not _blank(c) for c in r)]


# ---------------------------------------------------------------------------------------
# any labels file
# ---------------------------------------------------------------------------------------
def _is_worksheet(path: str | Path) -> bool:
    return Path(path).suffix.lower() in (".csv", ".xlsx")


def read_judgements(path: str | Path, assessor: str | None = None) -> list[Judgement]:
    """The judgements of a labels log (JSONL) or of a filled worksheet (``.csv``, ``.xlsx``)."""
    return read_worksheet(path, assessor) if _is_worksheet(path) else read_labels(path)


def label_file(path: str | Path, assessor: str | None = None) -> LabelFile:
    """A labels log or a filled worksheet as a :class:`~weknora_nb.core.lineage.LabelFile` (for
    :func:`~weknora_nb.core.lineage.merge_labels`: errors name its lines or rows)."""
    if _is_worksheet(path):
        return LabelFile(str(path), tuple(read_worksheet_entries(path, assessor)), "row")
    return read_label_file(path)
