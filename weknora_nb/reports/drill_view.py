"""04_degraded's drill-down of one degraded query, compact: one grid per query.

The grid has the stages in pipeline order as columns (:func:`weknora_nb.core.pipeline.stage_order`) and the ranks
as rows; each cell is the chunk that stage put at that rank, coloured by its grade (``wk-g0`` .. ``wk-g3``) and,
so that it is told apart without colour, its grade written in it; a labelled chunk is marked ``★`` wherever a
stage put it. A cell's tooltip holds its score and the start of its text. Above the grid: the reference answer,
the causes found at each stage with their evidence, and the labelled chunks (their text cut, the whole in a
collapsed block). Under it, collapsed: each stage's results as before (rank, chunk, grade, score, text), so that
every number is still on the page. The whole drill-down is a ``<details>`` block (open for the first few
queries, :data:`OPEN`), its summary naming the query and its causes. Every text is escaped
(:mod:`weknora_nb.reports.safe`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from weknora_nb.core.pipeline import stage_order
from weknora_nb.reports import cells, safe
from weknora_nb.reports.safe import esc

#: drill-downs shown open in a static report (the others collapsed, one line each)
OPEN = 3
#: characters of chunk text shown before the rest is folded, in tables and in a cell's tooltip
TEXT_CHARS = 160
ID_CHARS = 26
#: the labelled chunks shown (the most relevant first; the others collapsed) and their text's characters
LABEL_ROWS, LABEL_CHARS = 5, 100


def _grade(value: Any) -> int:
    return 0 if cells.is_missing(value) else int(value)


def grid_html(dd: Mapping[str, Any], definitions: Mapping[str, Any] | None = None) -> str:
    """The grid of what each stage returned (ranks x stages), labelled chunks marked, cells coloured by grade."""
    returned: Mapping[str, Any] = dd["returned"]
    if not returned:
        return safe.text("No stage returned anything for this query.")
    stages = stage_order(returned, definitions)
    labelled = set(map(str, dd["labels"]["chunk_id"])) if len(dd["labels"]) else set()
    depth = max(len(returned[s]) for s in stages)
    head = "<tr><th>rank</th>" + "".join(f"<th>{esc(s)}</th>" for s in stages) + "</tr>"
    rows = []
    for r in range(depth):
        tds = [f'<td class="wk-num">{r + 1}</td>']
        for s in stages:
            top = returned[s]
            if r >= len(top):
                tds.append("<td></td>")
                continue
            row = top.iloc[r]
            cid, g = str(row["chunk_id"]), _grade(row.get("grade"))
            score = row.get("score")
            tip = f"{cid}; grade {g}" + ("" if cells.is_missing(score) else f"; score {cells.number(float(score))}")
            text = cells.cut(row.get("content"), TEXT_CHARS)
            tip += f"\n{text}" if text else ""
            mark = "★ " if cid in labelled else ""
            tds.append(f'<td class="wk-text wk-g{min(max(g, 0), 3)}" title="{esc(tip)}">{esc(mark)}'
                       f"{esc(cells.cut(cid, ID_CHARS))} <small>g{g}</small></td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    legend = ("<p class=\"wk-legend\">Cells: the chunk each stage put at each rank, g0-g3 its grade (colour: "
              "<span class=\"wk-g1\">&nbsp;1&nbsp;</span> <span class=\"wk-g2\">&nbsp;2&nbsp;</span> "
              "<span class=\"wk-g3\">&nbsp;3&nbsp;</span>), ★ a labelled chunk; hover a cell for its score and "
              "text.</p>")
    return f'<table class="dataframe wk-table wk-grid">{head}{"".join(rows)}</table>{legend}'


def drilldown_html(dd: Mapping[str, Any], *, open_: bool = True, definitions: Mapping[str, Any] | None = None) -> str:
    """One degraded query's drill-down (see the module), all text escaped."""
    qid = str(dd["query_id"])
    causes = sorted({c for row in dd["causes"] for c in row["causes"]})
    summary = (f"<b>{esc(qid)}</b>: {esc(cells.cut(dd['query'], 80))}"
               f" <span class=\"wk-of\">— {esc(', '.join(causes) or 'no cause found')}</span>")
    parts = []
    if dd.get("answer") and not cells.is_missing(dd["answer"]):
        parts.append(f"<p><b>Reference answer:</b> {cells.markup(esc(dd['answer']))}</p>")
    stages = stage_order([c["stage"] for c in dd["causes"]], definitions)
    by_stage = {c["stage"]: c for c in dd["causes"]}
    lines = []
    for s in stages:
        c = by_stage[s]
        evidence = list(c["evidence"])
        lines.append(f"<li><b>{esc(s)}</b>: {esc(', '.join(c['causes']) or 'no cause found')}"
                     + (f'<details class="wk-fold"><summary>{esc(f"evidence ({len(evidence)})")}</summary>'
                        f"{safe.bullets(evidence)}</details>" if evidence else "") + "</li>")
    parts.append(f'<ul class="wk-causes">{"".join(lines)}</ul>')
    shown = [c for c in ("chunk_id", "grade", "integrity", "content") if c in dd["labels"].columns]
    parts.append("<p><b>Labelled chunks</b></p>" + safe.table(dd["labels"][shown], fold={"content": LABEL_CHARS},
                                                               limit=LABEL_ROWS))
    parts.append("<p><b>What each stage returned</b></p>" + grid_html(dd, definitions))
    lists = "".join(f"<p><b>{esc(s)}</b> returned</p>"
                    + safe.table(dd["returned"][s][["rank", "chunk_id", "grade", "score", "content"]],
                                 fold={"content": TEXT_CHARS})
                    for s in stage_order(dd["returned"], definitions))
    if lists:
        parts.append(f'<details class="wk-fold"><summary>{esc("each stage’s results with scores and text")}'
                     f"</summary>{lists}</details>")
    return (f'<details class="wk-drill" id="{esc("dd-" + qid)}"{" open" if open_ else ""}><summary>{summary}'
            f"</summary>{''.join(parts)}</details>")
