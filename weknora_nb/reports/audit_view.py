"""The config audit as the reports show it (docs/method.md, "Config audit"), one call a cell.

:func:`config_audit` (notebook 02) lists the named findings of every stage (the results that contradict a setting
the server says it applies), then the checks that found nothing and those that could not run, each with why;
:func:`degraded_audit` (notebook 04) says how many of the stage's degraded queries a finding concerns. Every text
(chunk ids, query ids, stage names) is escaped (:mod:`weknora_nb.reports.safe`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from IPython.display import HTML

from weknora_nb.analysis.config_audit import CLEAN, FINDING, NOT_CHECKED, AuditFinding, audit
from weknora_nb.core.run import Run
from weknora_nb.reports import safe


def config_audit(run: Run, *, findings: list[AuditFinding] | None = None) -> HTML:
    """The run's audit: a sentence, the findings (with examples), the clean checks, the checks not run."""
    found = findings if findings is not None else audit(run)
    parts = [safe.text(_summary(found))]
    hits = [f for f in found if f.status == FINDING]
    if hits:
        parts.append(safe.table(_findings_table(hits)))
    clean = [f for f in found if f.status == CLEAN]
    if clean:
        parts.append(safe.text("Checked, nothing contradicts the setting:"))
        parts.append(safe.table(_table(clean, ["stage", "name", "setting", "value", "checked", "unit", "source"])))
    skipped = [f for f in found if f.status == NOT_CHECKED]
    if skipped:
        parts.append(safe.text("Not checked (the run lacks what the check needs; never read as clean):"))
        parts.append(safe.table(_table(skipped, ["stage", "name", "setting", "value", "detail"])))
    return HTML("\n".join(parts))


def degraded_audit(run: Run, stage: str, degraded: Iterable[str], *,
                   findings: list[AuditFinding] | None = None) -> HTML:
    """The findings at ``stage`` and how many of its ``degraded`` query ids each concerns: a degraded query whose
    results contradict a setting may be degraded by the server not running what it says."""
    found = [f for f in (findings if findings is not None else audit(run)) if f.stage == stage]
    ids = set(map(str, degraded))
    hits = [f for f in found if f.status == FINDING]
    skipped = [f.name for f in found if f.status == NOT_CHECKED]
    not_run = f" Not checked at {stage}: {', '.join(dict.fromkeys(skipped))} (see 02)." if skipped else ""
    if not hits:
        checked = [f.name for f in found if f.status == CLEAN]
        said = (f"No check finds a result of stage {stage} that contradicts its settings"
                + (f" ({', '.join(dict.fromkeys(checked))})." if checked else " (no check could run)."))
        return HTML(safe.text(said + not_run))
    rows = [{"finding": f.name, "setting": f.setting, "value": _shown(f.value), "queries concerned": len(f.queries),
             "of them degraded": len(ids.intersection(f.queries)),
             "degraded examples": ", ".join(sorted(ids.intersection(f.queries))[:10]), "what it means": f.detail}
            for f in hits]
    said = (f"{len(hits)} finding(s) at stage {stage}: the results contradict a setting the server says it applies. "
            "A degraded query among them may be degraded because the server does not run that setting, not by "
            "the cause named above." + not_run)
    return HTML(safe.text(said) + safe.table(pd.DataFrame(rows)))


def _summary(found: list[AuditFinding]) -> str:
    """One sentence: how many findings, which, and how many checks were clean or not run."""
    hits = [f for f in found if f.status == FINDING]
    n_clean = sum(f.status == CLEAN for f in found)
    n_skip = sum(f.status == NOT_CHECKED for f in found)
    counts = f"{n_clean} check(s) clean, {n_skip} not checked."
    if not hits:
        return f"No result contradicts a setting the server says it applies: {counts}"
    names = ", ".join(f"{f.name} at {f.stage}" for f in hits)
    return f"{len(hits)} finding(s), results that contradict a setting the server says it applies: {names}; {counts}"


def _findings_table(hits: list[AuditFinding]) -> pd.DataFrame:
    """The findings with their counts, meaning and examples."""
    table = _table(hits, ["stage", "name", "setting", "value", "source", "contradicting", "checked", "unit",
                          "detail", "examples"])
    return table.rename(columns={"detail": "what it means"})


def _table(found: list[AuditFinding], columns: list[str]) -> pd.DataFrame:
    """``columns`` of the findings, examples joined by ``; ``."""
    rows = [{c: ("; ".join(f.examples) if c == "examples" else _shown(f.value) if c == "value" else getattr(f, c))
             for c in columns} for f in found]
    return pd.DataFrame(rows, columns=columns)


def _shown(value: object) -> str:
    """A setting's value as text: ``-`` when there is none, a number as short as it is."""
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)
