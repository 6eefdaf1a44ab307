"""Progress bars (core/progress.py): redrawn in place in a terminal, a line at a time in a log."""

from __future__ import annotations

import io

from weknora_nb.core.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drawn(total: int, desc: str, every_s: float, file: io.StringIO | None = None) -> str:
    """What a bar of ``total`` steps, updated one step at a time and closed, wrote to ``file`` (a log)."""
    out = file if file is not None else io.StringIO()
    bar = progress_bar(total=total, desc=desc, unit="step", file=out, every_s=every_s)
    for _ in range(total):
        bar.update(1)
    bar.close()
    return out.getvalue()


def counts(lines: list[str]) -> list[str]:
    """The ``n/total`` of each line a bar wrote outside a terminal (``desc: pct|bar| n/total [...]``)."""
    return [line.split("|")[2].split()[0] for line in lines]


def test_outside_a_terminal_each_redraw_is_a_line_of_its_own():
    log = drawn(5, "collecting baseline", every_s=0)
    lines = log.splitlines()
    assert "\r" not in log and len(lines) >= 6            # the start, each update, the end
    assert all(line.startswith("collecting baseline: ") for line in lines)
    assert "5/5" in lines[-1] and "100%" in lines[-1]


def test_outside_a_terminal_a_line_at_most_every_interval_and_the_last_state_at_the_end():
    lines = drawn(1000, "judging (pointwise)", every_s=3600).splitlines()
    assert len(lines) == 2 and "0/1000" in lines[0] and "1000/1000" in lines[1]


def test_in_a_terminal_the_bar_is_redrawn_in_place():
    shown = drawn(3, "tracing queries", every_s=0, file=Terminal())
    assert "\r" in shown and "3/3" in shown


def test_a_disabled_bar_writes_nothing():
    log = io.StringIO()
    bar = progress_bar(total=3, desc="measuring versions", unit="version", file=log, disable=True)
    bar.update(3)
    bar.close()
    assert log.getvalue() == ""


def test_outside_a_terminal_updates_far_apart_each_get_their_line_once_the_interval_passed():
    import time

    log = io.StringIO()
    bar = progress_bar(total=4, desc="measuring versions", unit="version", file=log, every_s=0.05)
    for _ in range(4):   # a version done every 0.1 s, as the demo's are every ten seconds or so
        time.sleep(0.1)
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    shown = counts(lines)
    assert list(dict.fromkeys(shown)) == ["0/4", "1/4", "2/4", "3/4", "4/4"] and len(shown) <= 6, lines


def test_outside_a_terminal_a_slowdown_after_fast_progress_still_gets_a_line_per_interval():
    import time

    log = io.StringIO()
    bar = progress_bar(total=203, desc="collecting baseline", unit="req", file=log, every_s=0.05)
    t = time.perf_counter()
    while bar.n < 200:                     # fast: a cached server, requests at 1000s a second
        bar.update(1)
        time.sleep(0.0005 if time.perf_counter() - t < 0.12 else 0)
    for _ in range(3):                     # then slow: each request waits on the server
        time.sleep(0.1)
        bar.update(1)
    bar.close()
    shown = counts(log.getvalue().splitlines())
    assert {"201/203", "202/203", "203/203"} <= set(shown), shown
