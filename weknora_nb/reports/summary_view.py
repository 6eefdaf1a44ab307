"""01_collect's manifest as an analyst reads it: a short summary (the target and its knowledge bases, the test set,
the stages, the effective retrieval configuration, repeats, dates, notes), the whole manifest flattened to
key / value in a collapsed block under it (``<details>``: the hundreds of ``integrity.*`` and ``system.*`` keys
are there for whoever needs them, not in the way). Every text is escaped (:mod:`weknora_nb.reports.safe`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from weknora_nb.reports import safe
from weknora_nb.reports.cells import value_text


def _short(value: Any, limit: int = 16) -> str:
    s = str(value or "")
    return s if len(s) <= limit else s[:limit] + "…"


def _json(value: Any) -> str:
    """A list or mapping as JSON, a line break in it shown as ``↵`` (a literal ``\\n`` reads as noise)."""
    return json.dumps(value, ensure_ascii=False).replace("\\n", "↵")


def summary_rows(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The few lines of the summary, as (what, value) pairs; a line whose value is missing is left out."""
    m = manifest
    target = m.get("target") or {}
    kbs = m.get("knowledge_bases") or {}
    kb_names = [f"{k} ({(v or {}).get('name')})" if isinstance(v, Mapping) and v.get("name") else str(k)
                for k, v in kbs.items()] or [str(k) for k in target.get("knowledge_base_ids") or []]
    server = m.get("server") or {}
    testset = m.get("testset") or {}
    stages = m.get("stages") or {}
    effective = ((m.get("retrieval_config") or {}).get("effective")) or {}
    counts = m.get("counts") or {}
    requests = {s: ", ".join(f"{k} {v}" for k, v in c.items()) for s, c in counts.items() if isinstance(c, Mapping)}
    rows = [
        ("run", f"{m.get('run_name', '')} ({m.get('status', 'status unknown')})"),
        ("target", f"{target.get('base_url', '')}, WeKnora {server.get('version', '?')} {server.get('edition', '')}"),
        ("knowledge bases", ", ".join(kb_names)),
        ("test set", f"{testset.get('path', '')}: {testset.get('n_queries', '?')} queries, "
                     f"{testset.get('n_valid', '?')} valid (hash {_short(testset.get('hash'), 20)})"),
        ("stages", "; ".join(f"{s} ({(v or {}).get('endpoint', '')}: {requests.get(s, 'no requests')})"
                             for s, v in stages.items())),
        ("repeats, concurrency", f"{m.get('repeats', '?')} repeats, {m.get('concurrency', '?')} at once"),
        ("effective retrieval config", "; ".join(f"{k} {value_text(v)}" for k, v in effective.items())),
        ("collected", f"{m.get('started_at', '?')} to {m.get('ended_at', '?')}"
                      + (f" (resumed {len(m['resumed_at'])} times)" if m.get("resumed_at") else "")),
        ("notes", "\n".join(map(str, m.get("notes") or []))),
    ]
    return [(k, v) for k, v in rows if v.strip(" ,;:()?")]


def manifest_html(manifest: Mapping[str, Any], flat: Mapping[str, Any]) -> str:
    """The summary table, then the flattened manifest ``flat`` (key -> value) collapsed, all escaped."""
    summary = pd.DataFrame(summary_rows(manifest), columns=["what", "value"])
    full = pd.DataFrame([(k, _json(v) if isinstance(v, (list, dict)) else v) for k, v in flat.items()],
                        columns=["key", "value"])
    label = safe.esc(f"the whole manifest ({len(full)} keys)")
    return f'{safe.table(summary)}<details class="wk-fold"><summary>{label}</summary>{safe.table(full)}</details>'
