"""What rendering a run's report produced (:class:`Report`): its folder, its pages, its index and headline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Report:
    """One run's report: ``run`` (its name), the ``folder`` holding it, its ``index`` page, each notebook's
    page (``pages``) and how long each took to render (``seconds``), and the figures the index shows
    (``headline``, :func:`weknora_nb.reports.index_page.headline`)."""

    run: str
    folder: Path
    index: Path
    pages: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    headline: dict[str, Any] = field(default_factory=dict)
