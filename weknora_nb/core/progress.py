"""Progress bars for long work (collection, judging, tracing, embedding, the demo's versions).

In a terminal or a notebook: tqdm's bar, redrawn in place (:mod:`tqdm.auto`: a widget in a
notebook). Anywhere else (a CI job's log, stderr sent to a file): tqdm redraws a line with
carriage returns, which a log keeps as one line growing by a copy of the bar per redraw. There
the bar is written as a line of its own at most every :data:`LOG_EVERY_S` seconds, and once more
when it closes, so that a log reads as a list of timestamps of progress.
"""

from __future__ import annotations

import sys
from typing import IO, Any

#: outside a terminal or a notebook, a progress line at most this often (seconds)
LOG_EVERY_S = 30.0


class _Lines:
    """A text file for tqdm that writes each redraw of a bar as a line of its own (a redraw that changes
    nothing, as closing a finished bar is, writes no second line)."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._last = ""

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line and line != self._last:
            self._out.write(line + "\n")
            self._last = line
        return len(text)

    def flush(self) -> None:
        self._out.flush()


def _in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (tqdm.auto then draws a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress_bar(*, total: int, desc: str, unit: str, initial: int = 0, disable: bool = False,
                 file: IO[str] | None = None, every_s: float = LOG_EVERY_S) -> Any:
    """A tqdm bar of ``total`` ``unit`` named ``desc`` on ``file`` (default stderr), drawn in place in a
    terminal or a notebook; elsewhere a line per ``every_s`` seconds at most, and the last state when closed."""
    from tqdm.auto import tqdm

    out = file if file is not None else sys.stderr
    if _in_notebook() or (hasattr(out, "isatty") and out.isatty()):
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=out)
    # miniters=1: the first update once every_s have passed is written (after fast progress, tqdm's own guess of
    # how many updates to skip would hold back the lines of a slowdown)
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=disable, file=_Lines(out),
                mininterval=every_s, miniters=1, ascii=True)
