"""Figures for the notebooks (matplotlib), with a font that renders Chinese.

:func:`use_cjk_font` registers WenQuanYi Micro Hei (shipped by the pinned PyPI package
``paperang-p2-fonts-cjk``) or, failing that, a CJK font already on the system, and warns
when there is none (Chinese would show as empty boxes).

:func:`figure_style` is the package's style, applied by every figure: that font, and text
shown as it is written. Stage, tag, query-type and run names are data, so matplotlib never
parses them as math text (``text.parse_math`` off): ``$x^$`` is a label, not an error. No
label of ours relies on ``$``.
"""

from __future__ import annotations

import glob
import logging
import warnings
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import font_manager

from weknora_nb.core.pipeline import stage_order
from weknora_nb.reports.tables import TIER_COLOURS

log = logging.getLogger(__name__)
_SYSTEM_CJK = ("Noto Sans CJK SC", "Noto Sans SC", "WenQuanYi Micro Hei", "WenQuanYi Zen Hei", "Source Han Sans SC",
               "SimHei", "Microsoft YaHei", "PingFang SC")


@lru_cache(maxsize=1)
def use_cjk_font() -> str | None:
    """Make matplotlib render Chinese; returns the font family used (None when none was found)."""
    family = None
    try:
        import paperang_p2_fonts_cjk

        for path in glob.glob(str(Path(paperang_p2_fonts_cjk.__file__).parent / "fonts" / "*.tt*")):
            font_manager.fontManager.addfont(path)
            family = "WenQuanYi Micro Hei"
    except ImportError:
        pass
    if family is None:
        have = {f.name for f in font_manager.fontManager.ttflist}
        family = next((f for f in _SYSTEM_CJK if f in have), None)
    if family is None:
        warnings.warn("no CJK font found: Chinese text in figures will not render. Install the requirements "
                      "(paperang-p2-fonts-cjk) or a CJK font such as Noto Sans CJK.", stacklevel=2)
        return None
    plt.rcParams["font.family"] = ["sans-serif"]
    plt.rcParams["font.sans-serif"] = [family, "DejaVu Sans"]
    plt.rcParams["axes.unicode_minus"] = False
    return family


def figure_style() -> None:
    """The style every figure is drawn in: the CJK font (:func:`use_cjk_font`) and no math text.

    Applied each time a figure is made (not once), so that a style a notebook sets in between
    cannot turn math text back on for names that hold ``$``.
    """
    use_cjk_font()
    plt.rcParams["text.parse_math"] = False


def _fig(width: float = 8, height: float = 4):
    figure_style()
    return plt.subplots(figsize=(width, height), layout="constrained")


def log_scale(ax, axis: str = "x") -> None:
    """Put ``ax``'s ``axis`` ("x" or "y") on a log scale whose tick labels are plain text (``10``, ``100``,
    ``20``...). matplotlib's own labels for a log axis are math text (``$\\mathdefault{10^{2}}$``), which the
    style's ``text.parse_math`` off would show as written; the plain formatter labels the same ticks."""
    from matplotlib.ticker import LogFormatter

    getattr(ax, f"set_{axis}scale")("log")
    scale = getattr(ax, f"{axis}axis")
    scale.set_major_formatter(LogFormatter())
    scale.set_minor_formatter(LogFormatter(labelOnlyBase=False))


def describe(fig) -> str:
    """``fig`` in words, for a report's alt text: the figure's title, then each panel's title, axis labels
    and series (legend entries), panels separated by `` | ``. What a reader who cannot see the figure needs
    to know what it shows; its values are in the tables beside it."""
    def text(artist) -> str:
        return " ".join(artist.get_text().split())

    def series(legend) -> list[str]:
        return [text(t) for t in legend.get_texts()] if legend is not None else []

    panels = []
    for ax in fig.axes:
        title, x, y = text(ax.title), text(ax.xaxis.label), text(ax.yaxis.label)
        parts = [p for p in (title, f"x: {x}" if x else "", f"y: {y}" if y else "") if p]
        names = series(ax.get_legend())
        if names:
            parts.append("series: " + ", ".join(names))
        if parts:
            panels.append("; ".join(parts))
    names = [n for legend in fig.legends for n in series(legend)]
    if names:
        panels.append("series: " + ", ".join(names))
    head = " ".join(fig.get_suptitle().split())
    return " | ".join([p for p in (head, *panels) if p]) or "a figure"


#: the IPython formatters :func:`describe_figures` already extended (a notebook may open its run twice)
_described: set[int] = set()


def describe_figures() -> None:
    """In an IPython kernel: each figure shown carries its description (:func:`describe`) as the image's metadata,
    which the reports' template writes as its alt text; the image is the inline backend's, byte for byte. Once per
    kernel; nothing outside IPython."""
    from IPython import get_ipython
    from matplotlib.figure import Figure

    shell = get_ipython()
    if shell is None:
        return
    png = shell.display_formatter.formatters["image/png"]
    if id(png) in _described:
        return
    plt.close(plt.figure())  # the inline backend registers its figure formatter with the first figure
    draw = png.lookup_by_type(Figure)

    def with_description(fig: Figure) -> Any:
        data = draw(fig)
        return data if data is None else (data, {"alt": describe(fig)})
    png.for_type(Figure, with_description)
    _described.add(id(png))


def _done(fig):
    """Detach the figure from pyplot so that Jupyter shows it once: as the value returned."""
    plt.close(fig)
    return fig


def metric_bars(table: pd.DataFrame, *, title: str = "Metrics by stage (95 % CI)"):
    """Grouped bars: metric on x, one bar per stage, error bars from ``ci_low``/``ci_high``, tier edge colour."""
    fig, ax = _fig(9, 4)
    metrics = list(dict.fromkeys(table["metric"]))
    stages = list(dict.fromkeys(table["stage"]))
    width = 0.8 / max(len(stages), 1)
    x = np.arange(len(metrics))
    for i, st in enumerate(stages):
        t = table[table["stage"] == st].set_index("metric").reindex(metrics)
        err = np.vstack([t["mean"] - t["ci_low"], t["ci_high"] - t["mean"]])
        bars = ax.bar(x + i * width - 0.4 + width / 2, t["mean"], width, yerr=err, capsize=2, label=st)
        for b, tier in zip(bars, t.get("tier", [None] * len(t)), strict=True):
            if isinstance(tier, str):
                b.set_edgecolor(TIER_COLOURS[tier])
                b.set_linewidth(2)
    ax.set_xticks(x, metrics)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("mean over valid queries")
    ax.set_title(title)
    fig.legend(loc="outside right upper", fontsize=8)  # beside the axes: inside, it covered the tallest bars
    return _done(fig)


def recall_funnel(table: pd.DataFrame, metric: str = "recall@10",
                  definitions: Mapping[str, Mapping[str, Any] | None] | None = None):
    """Recall at each pipeline stage, in pipeline order: where recall is lost.

    The order is :func:`weknora_nb.core.pipeline.stage_order`: by pipeline role (a custom
    stage's from its ``definitions``, the manifest's ``stages``), other stages last.
    """
    fig, ax = _fig(7, 3.5)
    t = table[table["metric"] == metric].set_index("stage")
    rows = t.loc[stage_order(t.index, definitions)[::-1]]   # bottom to top: the pipeline's first stage on top
    mean, low, high = (rows[c].to_numpy() for c in ("mean", "ci_low", "ci_high"))
    ax.barh(list(rows.index), mean, color="#4575b4", xerr=np.vstack([mean - low, high - mean]), capsize=3)
    for y, (v, h) in enumerate(zip(mean, high, strict=True)):   # past the interval, not under it
        ax.text(np.nanmax([v, h]) + 0.015, y, f"{v:.3f}", va="center", fontsize=9)
    ax.set_xlim(0, 1.15)
    ax.set_title(f"{metric} along the pipeline")
    return _done(fig)


def distributions(per_query: pd.DataFrame, metrics=("ndcg@10", "recall@10"), bins: int = 20):
    """Histograms of per-query values, one panel per metric, one colour per stage."""
    figure_style()
    metrics = [m for m in metrics if m in per_query.columns]
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.5), layout="constrained", squeeze=False)
    for ax, m in zip(axes[0], metrics, strict=True):
        for st, g in per_query.groupby("stage", sort=False):
            ax.hist(g[m], bins=bins, range=(0, 1), alpha=0.5, label=str(st))
        ax.set_title(f"per-query {m}")
        ax.set_xlabel(m)
        ax.set_ylabel("queries")
    axes[0][0].legend(fontsize=8)
    return _done(fig)


def heatmap(table: pd.DataFrame, *, value: str = "mean", title: str = ""):
    """Groups (rows) x metrics (columns), values written in the cells."""
    wide = table.pivot_table(index="label", columns="metric", values=value, sort=False)
    fig, ax = _fig(1.2 * len(wide.columns) + 3, 0.35 * len(wide) + 1.5)
    im = ax.imshow(wide.to_numpy(), cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(wide.columns)), wide.columns, rotation=30, ha="right")
    ax.set_yticks(range(len(wide.index)), wide.index)
    for i in range(wide.shape[0]):
        for j in range(wide.shape[1]):
            ax.text(j, i, f"{wide.iat[i, j]:.2f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax.set_title(title)
    return _done(fig)


def cause_bars(summary: pd.DataFrame):
    """Degraded queries by cause, one bar colour per stage; the figure grows with the causes and stages (0.06 in
    per bar, at least 3.5 in) so that each bar stays readable. None when no query is degraded (nothing to draw;
    the table above says so)."""
    body = summary.drop(index="degraded queries", errors="ignore")
    if body.empty or not (body.select_dtypes("number").to_numpy() > 0).any():
        return None
    fig, ax = _fig(8, max(3.5, 0.06 * body.size + 1.2))
    body.plot.barh(ax=ax, width=0.8)   # of each cause's slot, shared by its stages
    ax.invert_yaxis()
    ax.set_xlabel("degraded queries with this cause")
    ax.set_title("Causes of degraded queries")
    return _done(fig)


def delta_bars(metrics: pd.DataFrame):
    """Delta (B - A) per metric with its 95 % paired-bootstrap interval; filled when significant (Holm)."""
    fig, ax = _fig(8, 3.5)
    for run, t in metrics.groupby("run", sort=False):
        y = np.arange(len(t))
        sig = (t["p_holm"] < 0.05).to_numpy()
        ax.errorbar(t["delta"], y, xerr=np.vstack([t["delta"] - t["ci_low"], t["ci_high"] - t["delta"]]),
                    fmt="none", ecolor="grey", capsize=3)
        ax.scatter(t["delta"][sig], y[sig], color="#1a9850", zorder=3, label=f"{run}: significant")
        ax.scatter(t["delta"][~sig], y[~sig], facecolors="none", edgecolors="#d73027", zorder=3,
                   label=f"{run}: not significant")
        ax.set_yticks(y, t["metric"])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("delta vs baseline (95 % CI)")
    ax.legend(fontsize=8)
    ax.set_title("Change per metric")
    return _done(fig)


def paired_scatter(per_query: pd.DataFrame, metric: str = "ndcg@5"):
    """Each query: baseline value (x) vs compared value (y); above the diagonal = better."""
    fig, ax = _fig(5, 5)
    for run, g in per_query.groupby("run", sort=False):
        jitter = np.random.default_rng(0).normal(0, 0.008, (2, len(g)))
        ax.scatter(g[f"{metric}_a"] + jitter[0], g[f"{metric}_b"] + jitter[1], s=10, alpha=0.5, label=str(run))
    ax.plot([0, 1], [0, 1], color="black", lw=0.8)
    ax.set_xlabel(f"{metric}, baseline")
    ax.set_ylabel(f"{metric}, compared")
    ax.legend(fontsize=8)
    ax.set_title(f"Per-query {metric}")
    return _done(fig)


def latency_cdf(latencies: dict[str, np.ndarray]):
    """Cumulative distribution of request latency (ms) per run or stage, with p50/p95 marked."""
    fig, ax = _fig(7, 3.5)
    for name, v in latencies.items():
        v = np.sort(np.asarray(v, dtype=float))
        v = v[~np.isnan(v)]
        if not len(v):
            continue
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=f"{name} (p50 {np.percentile(v, 50):.0f}, "
                                                             f"p95 {np.percentile(v, 95):.0f} ms)")
    ax.axhline(0.95, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("share of requests")
    log_scale(ax)
    ax.legend(fontsize=8)
    ax.set_title("Latency")
    return _done(fig)
