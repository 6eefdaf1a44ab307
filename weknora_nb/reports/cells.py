"""How a value reads in a report's table: what an analyst reads, not what pandas prints.

- Numbers: integers as integers; other floats with 3 decimals (``0.564``, ``+0.207`` is the sign's
  business), 1 decimal from 100 and none from 10,000 (latencies: ``425.3``, ``12,345``); a value
  that rounds to 0 but is not 0 reads ``<0.001`` (``>-0.001`` below 0), so a p-value of 0.0002
  never reads ``0.000``. A column is formatted as a whole, so its values share their decimals.
- Missing values (None, NaN, ``pd.NA``, ``NaT``) are blank: never ``None``, ``NaN`` or ``<NA>``.
- Booleans read ``yes`` / ``no``; lists ``a, b, c``; mappings ``key: value; ...``.
- Column names are plain words (:func:`plain_name`: ``p_holm`` reads ``p (Holm)``, ``n_queries``
  ``queries``, other ``_`` spaces); a ``ci_low`` and ``ci_high`` pair becomes one ``95 % CI``
  column, ``[low, high]``.
- Text keeps its line breaks (:func:`markup` turns them into ``<br>`` after escaping) and WeKnora's
  citation markup ``<kb doc="..." chunk_id="..." />`` reads as a small chip naming the document,
  the chunk id in its tooltip.

Nothing here escapes: :mod:`weknora_nb.reports.safe` escapes every text first and then applies
:func:`markup`, which only rewrites what escaping produced (so data can never inject markup).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

#: column names that read better in words (others: ``_`` becomes a space)
PLAIN_NAMES = {
    "n_queries": "queries", "p_holm": "p (Holm)", "p_value": "p", "p_holm_all": "p (Holm, every metric)",
    "mean_a": "baseline mean", "mean_b": "compared mean", "repeat_std": "SD across repeats",
    "p50_ms": "p50 (ms)", "p95_ms": "p95 (ms)", "p99_ms": "p99 (ms)", "delta_p50_ms": "p50 change (ms)",
    "delta_p95_ms": "p95 change (ms)", "delta_p99_ms": "p99 change (ms)", "latency_ms": "latency (ms)",
    "mde": "smallest detectable effect", "n_needed": "queries needed", "power_now": "power now",
    "share_queries": "share from queries", "share_repeats": "share from repeats", "kendall_tau": "Kendall's tau",
    "rbo": "RBO", "delta_irrelevant": "delta, unjudged as irrelevant", "delta_relevant": "delta, unjudged as relevant",
    "d_z": "d_z", "sd": "SD",
}
#: the two columns merged into one interval column, and its name
CI_COLUMNS, CI_NAME = ("ci_low", "ci_high"), "95 % CI"


def plain_name(name: Any) -> str:
    """A column name as words: :data:`PLAIN_NAMES`, else ``_`` read as a space (``query_id``: ``query id``)."""
    if isinstance(name, tuple):
        return " ".join(plain_name(n) for n in name if str(n))
    text = str(name)
    return PLAIN_NAMES.get(text, text.replace("_", " "))


def is_missing(value: Any) -> bool:
    """None, NaN, ``pd.NA`` and ``NaT``: what a table shows blank."""
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    if isinstance(value, (float, np.floating)):
        return math.isnan(value)
    return False


def decimals_for(values: np.ndarray) -> int:
    """The decimals a column of floats is shown with: 3, then 1 from 100 and 0 from 10,000 (its largest value)."""
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if len(finite) else 0.0
    return 3 if top < 100 else 1 if top < 10_000 else 0


def number(x: float, decimals: int = 3) -> str:
    """``x`` with ``decimals`` decimals (thousands separated from 10,000); a non-zero value that would read 0
    reads ``<0.001`` or ``>-0.001``; an integral value of a column shown without decimals has none."""
    if is_missing(x):
        return ""
    x = float(x)
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    step = 10.0 ** -decimals
    if x != 0 and abs(x) < step / 2:
        return f"<{step:.{decimals}f}" if x > 0 else f">-{step:.{decimals}f}"
    return f"{x:,.{decimals}f}" if abs(x) >= 10_000 else f"{x:.{decimals}f}"


def value_text(value: Any) -> str:
    """One value as text, on its own (not in a column): see the module's rules."""
    if is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else number(v, decimals_for(np.array([v])))
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {value_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return ", ".join(value_text(v) for v in value)
    return str(value)


def column_texts(col: pd.Series) -> tuple[list[str], bool]:
    """The texts of a column's cells, and whether it is a number column (right-aligned; text is left-aligned)."""
    dtype = col.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return [value_text(v) for v in col], False
    if pd.api.types.is_integer_dtype(dtype):
        return [value_text(v) for v in col], True
    if pd.api.types.is_float_dtype(dtype):
        values = col.to_numpy(dtype=float, na_value=np.nan)
        finite = values[np.isfinite(values)]
        if len(finite) and np.all(finite == np.round(finite)) and np.all(np.abs(finite) < 1e15):
            return ["" if np.isnan(v) else number(v, 0) if np.isinf(v) else str(int(v)) for v in values], True
        d = decimals_for(values)
        return [number(v, d) for v in values], True
    texts = [value_text(v) for v in col]
    numeric = all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                  or is_missing(v) for v in col) and any(not is_missing(v) for v in col)
    return texts, numeric


def interval_texts(low: pd.Series, high: pd.Series) -> list[str]:
    """``[low, high]`` per row with the decimals of both columns together; blank when either is missing."""
    lo, hi = (s.to_numpy(dtype=float, na_value=np.nan) for s in (pd.to_numeric(low, errors="coerce"),
                                                                  pd.to_numeric(high, errors="coerce")))
    d = decimals_for(np.concatenate([lo, hi]))
    return ["" if np.isnan(a) or np.isnan(b) else f"[{number(a, d)}, {number(b, d)}]"
            for a, b in zip(lo, hi, strict=True)]


#: WeKnora's citation markup as it reads once escaped: ``&lt;kb doc=&quot;...&quot; ... /&gt;``
_CITATION = re.compile(r"&lt;kb\s+((?:[\w-]+=(?:&quot;|&#x27;).*?(?:&quot;|&#x27;)\s*)+)/?&gt;")
#: a citation cut off at the end of a text cut short (``&lt;kb doc=&quot;x&quot; chunk_i…``): dropped
_CUT_CITATION = re.compile(r"&lt;kb\b(?:(?!&gt;).)*$", re.DOTALL)
_ATTRIBUTE = re.compile(r"([\w-]+)=(?:&quot;|&#x27;)(.*?)(?:&quot;|&#x27;)")


def _chip(match: re.Match[str]) -> str:
    attrs = dict(_ATTRIBUTE.findall(match.group(1)))
    name = attrs.get("doc") or attrs.get("chunk_id") or "citation"
    tip = attrs.get("chunk_id", "")
    return f'<span class="wk-cite" title="{tip}">{name}</span>'


def markup(escaped: str) -> str:
    """Escaped text made readable: line breaks as ``<br>`` and citations as chips (a citation cut off at the end of
    a shortened text is dropped, ``…`` in its place). Only what escaping produced is rewritten (the attribute values
    a chip shows are the escaped text itself)."""
    chipped = _CUT_CITATION.sub("…", _CITATION.sub(_chip, escaped))
    return chipped.replace("\r\n", "\n").replace("\n", "<br>")


def cut(text: Any, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut); blank for a missing value."""
    s = value_text(text)
    return s if len(s) <= limit else s[: max(limit - 1, 0)].rstrip() + "…"
