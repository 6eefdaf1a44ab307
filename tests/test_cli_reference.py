"""docs/cli.md stays true: every command and every option the command line's help shows is in it."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from weknora_nb.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--help"]) == 0
    return out.getvalue()


def _subcommands(text: str) -> list[str]:
    """The names of ``{a,b,c}`` in a usage line, or []."""
    m = re.search(r"(?<!\S)\{([a-z0-9_,-]+)\}\s+\.\.\.", text)
    return m.group(1).split(",") if m else []


def _commands(*prefix: str) -> list[tuple[str, ...]]:
    text = _help(*prefix)
    subs = _subcommands(text.split("\n\n")[0])
    if not subs:
        return [prefix]
    return [c for s in subs for c in _commands(*prefix, s)]


def test_every_command_and_option_is_documented():
    doc = DOC.read_text(encoding="utf-8")
    missing = []
    for command in _commands():
        name = " ".join(command)
        if f"weknora-nb {name}" not in doc:
            missing.append(name)
        for opt in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _help(*command))) - {"--help"}):
            if f"`{opt}" not in doc:
                missing.append(f"{name} {opt}")
    assert not missing, f"docs/cli.md lacks: {missing}"
