"""Generated questions beside the others (docs/method.md section 17): the figures split by source, each source's
lexical overlap with its answers, and the warnings a report shows. The bias is measured, not assumed.

- :func:`source_table`: one row per source group (``synthetic``, ``traffic``, ``(none)`` for records that name no
  source, ...) and stage: the valid scored queries ``n``, their mean overlap with their best answer
  (:func:`~.overlap.query_overlaps`; NaN without the chunks' texts) and each metric's mean with its 95 % bootstrap
  interval (:func:`weknora_nb.analysis.stratify.stratify` on the ``source`` dimension).
- :func:`lexical_advantage`: per source group, keyword minus vector for a metric: how much more the keyword path
  gains on a source's questions. Generated questions reuse their chunk's words, so their advantage is larger than
  real traffic's.
- :func:`source_warnings`, in plain words:

  - the generated questions are the majority: more than half of the valid queries are ``synthetic``;
  - they overlap far more: their mean overlap exceeds the other queries' by more than :data:`OVERLAP_GAP`;
  - nothing to compare with: every valid query is generated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from weknora_nb.analysis.stratify import NO_SOURCE, stratify
from weknora_nb.analysis.synthetic.overlap import query_overlaps
from weknora_nb.core.scoring import Scores
from weknora_nb.core.synthetic import SYNTHETIC
from weknora_nb.core.testset import TestSet

#: the share of the valid queries above which generated ones are the majority
MAJORITY = 0.5
#: how far the generated questions' mean overlap may exceed the other queries' before a report warns
OVERLAP_GAP = 0.10


def sources(testset: TestSet) -> pd.Series:
    """Each query's source group, indexed by query id (:data:`~weknora_nb.analysis.stratify.NO_SOURCE` where the
    record names none)."""
    q = testset.queries
    src = q["source"] if "source" in q else pd.Series([None] * len(q))
    return pd.Series([s if isinstance(s, str) else NO_SOURCE for s in src], index=q["query_id"].tolist(),
                     name="source")


def overlaps(testset: TestSet, chunk_texts: Mapping[str, str] | None) -> pd.Series:
    """Each valid query's overlap with its best answer from the chunks' texts (:func:`~.overlap.query_overlaps`);
    without texts, the ``overlap`` the records carry (generated ones do), NaN elsewhere."""
    if chunk_texts:
        return query_overlaps(testset, chunk_texts)
    q = testset.queries[testset.queries["valid"]]
    stored = q["overlap"] if "overlap" in q else pd.Series([np.nan] * len(q))
    return pd.Series(stored.to_numpy(dtype=float), index=q["query_id"].tolist(), name="overlap")


def source_table(scores: Scores, testset: TestSet, chunk_texts: Mapping[str, str] | None, *,
                 stages: Iterable[str], metrics: Iterable[str], resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per (source, stage) of ``stages`` that was scored: ``source``, ``stage``, ``n``, ``overlap`` and,
    for each metric, its mean, ``<metric> low`` and ``<metric> high`` (the 95 % interval)."""
    mets = list(metrics)
    over = overlaps(testset, chunk_texts)
    src = sources(testset)
    rows = []
    for stage in stages:
        if stage not in scores.stages:
            continue
        s = stratify(scores, testset, stage=stage, metrics=mets, dimensions=["source"], resamples=resamples,
                     seed=seed)
        for group, g in s.groupby("group", sort=True):
            members = pq_ids(scores, stage).intersection(src.index[src == group])
            row: dict[str, object] = {"source": group, "stage": stage, "n": int(g["n"].iloc[0]),
                                      "overlap": float(over.reindex(list(members)).mean())}
            for m in mets:
                r = g[g["metric"] == m].iloc[0]
                row.update({m: r["mean"], f"{m} low": r["ci_low"], f"{m} high": r["ci_high"]})
            rows.append(row)
    return pd.DataFrame(rows)


def pq_ids(scores: Scores, stage: str) -> pd.Index:
    """The ids of the valid queries scored at ``stage``."""
    pq = scores.per_query_mean()
    return pd.Index(pq.loc[pq["stage"] == stage, "query_id"].unique())


def lexical_advantage(table: pd.DataFrame, metric: str, keyword: str = "keyword",
                      vector: str = "vector") -> pd.DataFrame:
    """Per source: the metric at the keyword and vector stages, keyword minus vector, and the mean overlap; empty
    when either stage is missing from ``table``."""
    if table.empty or not {keyword, vector} <= set(table["stage"]):
        return pd.DataFrame(columns=["source", "n", "overlap", keyword, vector, "keyword - vector"])
    wide = table.pivot(index="source", columns="stage", values=metric)
    out = pd.DataFrame({"n": table[table["stage"] == keyword].set_index("source")["n"],
                        "overlap": table[table["stage"] == keyword].set_index("source")["overlap"],
                        keyword: wide[keyword], vector: wide[vector]})
    out["keyword - vector"] = out[keyword] - out[vector]
    return out.reset_index().rename(columns={"index": "source"})


def source_warnings(testset: TestSet, overlap: pd.Series) -> list[str]:
    """The warnings of the module docstring, in plain words (none when the test set holds no generated query)."""
    src = sources(testset)
    valid = testset.queries.loc[testset.queries["valid"], "query_id"].tolist()
    synthetic = [q for q in valid if src[q] == SYNTHETIC]
    if not synthetic:
        return []
    others = [q for q in valid if src[q] != SYNTHETIC]
    out = []
    if len(synthetic) > MAJORITY * len(valid):
        out.append(f"{len(synthetic)} of {len(valid)} valid queries are generated (source: synthetic): the figures "
                   "mostly describe questions written from the chunks, which reuse the chunks' words and flatter "
                   "keyword retrieval; sample real traffic (weknora-nb testset sample) as soon as there is some.")
    mine = float(overlap.reindex(synthetic).mean())
    if not others:
        out.append(f"Every valid query is generated (mean overlap with its chunk {mine:.2f}): there is no traffic "
                   "to compare the overlap with, so how far keyword figures flatter is not known.")
        return out
    theirs = float(overlap.reindex(others).mean())
    if np.isfinite(mine) and np.isfinite(theirs) and mine - theirs > OVERLAP_GAP:
        out.append(f"Generated questions share {mine:.0%} of their tokens with their answer chunk, the other "
                   f"queries {theirs:.0%}: keyword retrieval looks better on generated questions than it will on "
                   "real traffic. Compare the keyword and vector figures by source before trusting them.")
    return out
