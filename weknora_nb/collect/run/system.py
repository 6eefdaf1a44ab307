"""The system description a run records: a YAML mapping the user writes (``collect --system FILE``).

What the measured WeKnora deployment is made of (chunking, embedding model, index,
thresholds, rerank, ...) is not visible through its API, so the user states it in a small
YAML file; the collector stores it under ``system`` in the run's manifest, and comparisons
diff it. Any mapping is accepted (docs/user-guide.md, "Describing the system", shows the usual keys)::

    chunking: {strategy: structure-aware, max_chars: 512}
    embedding: {model: text-embedding-v4, dims: 1024}
    rerank: {model: bge-reranker-v2-m3, top_k: 10}
    deployed: 2024-05-01

Dates are recorded as ISO strings (the manifest is JSON).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from weknora_nb.core.errors import ConfigError, Problem

_EXAMPLE = "e.g. 'embedding: {model: bge-m3}'"


def load_system_description(path: str | Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path``, with dates as ISO strings.

    Raises
    ------
    ConfigError
        The file is missing, is a folder, is not UTF-8 or not valid YAML (the problem
        names the line and column of the YAML error), its top level is not a mapping,
        or it holds a value JSON cannot record.
    """
    import yaml

    p = Path(path)
    text = _read_text(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(p, [_yaml_problem(p, exc)]) from None
    except UNBUILDABLE as exc:  # a scalar YAML cannot build (a date 2024-13-45, "!!int x"), or too deep
        raise ConfigError(p, f"not valid YAML: {_unbuildable(exc)}") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__} ({str(data)[:60]!r})"
        raise ConfigError(p, f"a system description is a YAML mapping of names to values, {_EXAMPLE}. "
                             f"Got {got} instead.")
    try:
        return json.loads(json.dumps(data, default=_iso_date, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:  # also .nan and .inf: strict JSON has neither
        raise ConfigError(p, f"holds a value the manifest (JSON) cannot record: {_unbuildable(exc)}") from None


#: what PyYAML raises besides its YAMLError while building values: a timestamp or number that does not
#: exist (ValueError; AttributeError for "!!timestamp x", IndexError for an empty "!!int"), nesting
#: deeper than Python's recursion limit
UNBUILDABLE: tuple[type[Exception], ...] = (ValueError, TypeError, AttributeError, IndexError, KeyError,
                                            OverflowError, RecursionError)


def _unbuildable(exc: BaseException) -> str:
    """One line about a value that could not be built or recorded."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, (AttributeError, IndexError, KeyError)):
        return "a value its tag does not allow (e.g. '!!timestamp' on text that is no date, an empty '!!int')"
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _read_text(p: Path) -> str:
    """The file's text; a missing file, a folder or bytes that are not UTF-8 raise :class:`ConfigError`."""
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(p, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(p, "is a folder; a system description is a YAML file") from None
    except PermissionError:
        raise ConfigError(p, "cannot be read (permission denied)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(p, f"not valid UTF-8 (byte offset {exc.start})") from None


def _yaml_problem(p: Path, exc: Exception) -> Problem:
    """A :class:`Problem` at the line of a YAML error (its ``problem_mark``, 0-based, is shown 1-based)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    what = " ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    what = what or str(exc).splitlines()[0]
    if mark is None:
        return Problem(str(p), None, None, f"not valid YAML: {what}")
    return Problem(str(p), mark.line + 1, None, f"not valid YAML (column {mark.column + 1}): {what}")


def _iso_date(value: Any) -> str:
    """``json.dumps`` fallback: dates and times as ISO 8601 strings; anything else is refused."""
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return value.isoformat()
    raise TypeError(f"a value of type {type(value).__name__} ({str(value)[:60]!r})")
