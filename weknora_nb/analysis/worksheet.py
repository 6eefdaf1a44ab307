"""The worksheet people judge pooled chunks in, and reading any labels file (docs/method.md §10).

The worksheet (:func:`write_worksheet`) is a CSV in UTF-8 with a BOM, so that Excel shows
Chinese right, or an XLSX file (openpyxl), with the columns :data:`WORKSHEET_COLUMNS`
(:func:`weknora_nb.analysis.pooling.pool` fills them; ``testset carry-over`` writes its review
worksheet with them too). People fill ``grade`` (0-3; blank = not judged) and ``assessor``;
:func:`read_worksheet` turns the filled sheet back into judgements for ``testset merge-labels``
and ``testset agreement``. A cell a spreadsheet would run as a formula (text starting with ``=``,
``+``, ``-``, ``@``) is written with a leading ``'`` in a CSV and as a text cell in an XLSX, so
chunk text never executes; reading takes the ``'`` off again.

:func:`read_judgements` and :func:`label_file` read either kind of labels file: a labels log
(JSON lines) or a filled worksheet (``.csv``, ``.xlsx``).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weknora_nb.core.errors import InputError, Problem, UsageError, reading, writing
from weknora_nb.core.files import atomic_path
from weknora_nb.core.labels import GRADES, Judgement, read_labels
from weknora_nb.core.lineage import LabelFile, read_label_file

if TYPE_CHECKING:
    import pandas as pd

WORKSHEET_COLUMNS = ("query_id", "query", "chunk_id", "knowledge_title", "content", "found_in", "best_rank",
                     "grade", "assessor", "note")
#: first characters that make a spreadsheet read a cell as a formula
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def blank(value: Any) -> bool:
    """A cell that holds nothing: None, NaN, ``""``, or pandas' missing value as text."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value) in ("", "<NA>", "nan")


def _cell_text(value: Any) -> str:
    """A cell's text: blanks for missing values, integers without ``.0``."""
    if blank(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _defused(text: str) -> str:
    """``text`` with a leading ``'`` when a spreadsheet would read it as a formula."""
    return "'" + text if text.startswith(_FORMULA_START) else text


#: the formats a worksheet is written in, by the path's suffix
WORKSHEET_SUFFIXES = (".csv", ".xlsx")


def check_worksheet_path(path: str | Path, argument: str = "--out") -> Path:
    """``path`` when its suffix names a worksheet format (:data:`WORKSHEET_SUFFIXES`), else :class:`UsageError`
    naming ``argument``: a file is written in the format its name says, or not at all."""
    p = Path(path)
    if p.suffix.lower() not in WORKSHEET_SUFFIXES:
        raise UsageError(argument=f"{argument} (a worksheet)", allowed="a path ending in .csv or .xlsx", got=str(path))
    return p


def write_worksheet(rows: pd.DataFrame, path: str | Path) -> Path:
    """Write worksheet rows (:data:`WORKSHEET_COLUMNS` first, then any others) as CSV (UTF-8 with a
    BOM) or, for a path ending in ``.xlsx``, as an Excel workbook; atomically."""
    p = check_worksheet_path(path)
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
    return header, [(i, r) for i, r in enumerate(rows[1:], start=2) if any(not blank(c) for c in r)]


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
