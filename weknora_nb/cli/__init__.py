"""Command line: ``weknora-nb <command> ...`` (also ``python -m weknora_nb``).

Exit codes (only :func:`main` maps errors to them, through :data:`EXIT_CODES`):

- 0 success;
- 1 the work ran but its verdict is negative: a gate bound broken, an incomplete run, nothing that could be
  scored (:class:`NothingScored`: no valid query, every request of the stage failed), a
  notebook that failed (:class:`ReportError`), a request that failed (:class:`RequestFailed`),
  a sandbox that could not serve (:class:`SandboxError`), a file that could not be written
  (:class:`StorageError`: a read-only folder, a full disk);
- 2 unusable input: a bad option (argparse, :class:`UsageError`, :class:`MetricError`), a
  file that fails validation (:class:`InputError`), a folder that is not a run, a run
  folder already used, runs that cannot be compared, or a file named on the command line
  that cannot be opened;
- 130 interrupted (Ctrl-C, :class:`Interrupted`): what was done is kept and the message gives
  the command that resumes;
- 141 the output's reader stopped reading (``weknora-nb score ... | head``), silently, as a
  program ended by SIGPIPE (:func:`run`).

Each error is one line on stderr, ``error: <message>``, naming the argument, the allowed
values and what arrived (an :class:`InputError` lists its problems on the lines after its
first). A user's mistake never shows a traceback. Command functions return 0 or 1 or
raise; they import what they need when they run, so ``weknora-nb --help`` loads no
pandas, httpx or matplotlib.

The parser is :func:`build_parser`. Each command group is a module of this package that defines its sub-parser
(``add_*``) and what it runs (``cmd_*``): :mod:`.score`; :mod:`.collect` (``collect``, ``check``); :mod:`.gate`
(``gate``, ``export``); :mod:`.report` (``report``, ``demo``); :mod:`.sandbox`; :mod:`.testset`; :mod:`.judge`;
:mod:`.grading` (``testset grade``, ``testset calibration``, ``testset label-next``, ``corrected``).
The option types they share are in :mod:`.options`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn

from weknora_nb._version import __version__
from weknora_nb.cli.collect import add_check, add_collect
from weknora_nb.cli.gate import add_export, add_gate
from weknora_nb.cli.grading import add_corrected
from weknora_nb.cli.judge import add_judge
from weknora_nb.cli.report import add_demo, add_report
from weknora_nb.cli.sandbox import add_sandbox
from weknora_nb.cli.score import add_score
from weknora_nb.cli.testset import add_testset
from weknora_nb.core.errors import (
    InputError,
    Interrupted,
    NotComparableError,
    NothingScored,
    ReportError,
    RequestFailed,
    RunExistsError,
    RunFolderError,
    SandboxError,
    StorageError,
    UsageError,
)

#: error class -> exit code, checked in order (the first class the error is an instance of wins)
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (RequestFailed, 1),
    (NothingScored, 1),
    (ReportError, 1),
    (SandboxError, 1),
    (StorageError, 1),
    (Interrupted, 130),
    (UsageError, 2),
    (InputError, 2),
    (RunFolderError, 2),
    (RunExistsError, 2),
    (NotComparableError, 2),
    (FileNotFoundError, 2),
    (IsADirectoryError, 2),
    (PermissionError, 2),
    (NotADirectoryError, 2),
)


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line, ``<prog>: error: <message>``, and exit 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line with a pointer to ``--help`` and exit with status 2."""
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> ArgumentParser:
    """The ``weknora-nb`` parser: global options and one sub-parser per command."""
    p = ArgumentParser(prog="weknora-nb", description="Measure how well a WeKnora knowledge base retrieves.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (add_score, add_collect, add_check, add_gate, add_export, add_report, add_demo, add_sandbox,
                add_testset, add_judge, add_corrected):
        add(sub)
    return p


def exit_code(exc: BaseException) -> int | None:
    """The exit code :data:`EXIT_CODES` gives ``exc``, or None when it is not a user-facing error."""
    return next((code for cls, code in EXIT_CODES if isinstance(exc, cls)), None)


def error_message(exc: BaseException) -> str:
    """The text after ``error:``: one line (an :class:`InputError` keeps its problem lines)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.strerror}: {exc.filename}"  # e.g. "No such file or directory: 't.jsonl'"
    else:
        text = str(exc)
    if isinstance(exc, InputError):
        return text
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _exit_status(code: Any) -> int:
    """SystemExit's code as an int (None is 0; argparse passes ints)."""
    return code if isinstance(code, int) else 0 if code is None else 1


def run() -> int:
    """The ``weknora-nb`` program (and ``python -m weknora_nb``): :func:`main` of the process's arguments. A reader
    of stdout that stops reading (``weknora-nb score ... | head``) ends it silently with status 141, as SIGPIPE
    ends a command-line tool."""
    try:
        code = main()
        sys.stdout.flush()   # here, where a reader that stopped is caught, not in the interpreter's exit
        return code
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # nothing more to flush at exit
        return 141


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argparse error already printed on one line
        return _exit_status(exc.code)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed: an interrupted command tells how to resume
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        code = int(args.func(args) or 0)
    except Exception as exc:
        error_code = exit_code(exc)
        if error_code is None:
            raise  # a bug, not a user's mistake: the traceback is wanted
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return error_code
    return code

