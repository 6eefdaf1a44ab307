"""The demo: the whole workbench on the embedded sandbox, end to end.

Builds the sandbox index, serves each system version of ``data/demo/versions.yaml`` on
loopback in turn, collects the demo test set at every stage with 3 repeats, renders all
reports (baseline alone, then each other version compared with the baseline), stops the
sandbox and returns the path of ``outputs/reports/index.html``.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from weknora_nb.collect.client import API_KEY_ENV, ClientSettings
from weknora_nb.collect.collector import collect
from weknora_nb.core.errors import RunExistsError
from weknora_nb.reports.render import Report, render_report, write_overview
from weknora_nb.sandbox import SandboxServer, build_index, demo_dir, load_demo_versions

__all__ = ["DemoResult", "run_demo"]

log = logging.getLogger(__name__)
DEMO_STAGES = "vector,keyword,hybrid,final,citations"


@dataclass
class DemoResult:
    index: Path
    reports: list[Report]
    seconds: dict[str, float] = field(default_factory=dict)


def run_demo(out: str | Path = "outputs", *, repeats: int = 3, versions: list[str] | None = None,
             stages: str = DEMO_STAGES, no_input: bool = False, progress: bool = True,
             concurrency: int = 16) -> DemoResult:
    """Run the demo; ``seconds`` holds the wall time of each phase (index, collect, render)."""
    out = Path(out).resolve()
    if not os.environ.get(API_KEY_ENV):
        # the sandbox and the collector read the same variable; it lives only in this process
        os.environ[API_KEY_ENV] = f"sk-sandbox-{secrets.token_hex(12)}"
    all_versions = load_demo_versions()
    names = versions or list(all_versions)
    base = names[0]
    t = {}
    t0 = time.perf_counter()
    build_index(show_progress=progress)
    for v in names:
        build_index().warm(all_versions[v])
    t["index"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    testset = demo_dir() / "testset.jsonl"
    for v in names:
        run_dir = out / "runs" / v
        with SandboxServer(v) as sb:
            kwargs = dict(stages=stages, repeats=repeats, concurrency=concurrency, system=sb.describe(),
                          progress=progress, run_name=v)
            try:
                summary = collect(ClientSettings(sb.base_url), sb.kb_id, testset, run_dir,
                                  resume=(run_dir / "manifest.json").exists(), **kwargs)
            except RunExistsError:
                log.info("%s holds an older demo run: collecting it again", run_dir)
                shutil.rmtree(run_dir)
                summary = collect(ClientSettings(sb.base_url), sb.kb_id, testset, run_dir, **kwargs)
        log.info(summary.describe())
    t["collect"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    reports = [render_report(out / "runs" / base, out_root=out / "reports", no_input=no_input)]
    for v in names[1:]:
        reports.append(render_report(out / "runs" / v, [out / "runs" / base], out_root=out / "reports",
                                     no_input=no_input))
    index = write_overview(reports, out / "reports" / "index.html")
    t["render"] = time.perf_counter() - t0
    return DemoResult(index, reports, t)
