"""The option types of ``weknora-nb``: argparse ``type`` functions that check a value while the command line is
parsed, so a bad option ends in argparse's one-line error and exit 2 before any work starts; and
:func:`check_run_folder`, the check of a run-folder option made when a command runs.

A type that defers to a library's own rule (metric names, gate bounds, fault settings, the domain adjustment)
imports it only when called, so building the parser loads none of them; the :class:`UsageError` such a rule
raises becomes argparse's message (:func:`_argument_type`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable
from typing import Any, TypeVar

from weknora_nb.core.errors import RunFolderError, UsageError

T = TypeVar("T")
#: what ``add_subparsers()`` returns, handed to each command module's ``add_*`` (argparse's class of it is private)
Subparsers = Any


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}. Got {text!r} instead.")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _number(text: str) -> float:
    """``text`` as a float; NaN when it is not a number (the argparse types below refuse NaN)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def positive_seconds(text: str) -> float:
    """An argparse ``type`` accepting a finite number of seconds > 0."""
    value = _number(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0. Got {text!r} instead.")
    return value


def finite_number(text: str) -> float:
    """An argparse ``type`` accepting a finite number."""
    value = _number(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number. Got {text!r} instead.")
    return value


def non_negative(text: str) -> float:
    """An argparse ``type`` for a finite number >= 0 (a price, a temperature)."""
    value = _number(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0. Got {text!r} instead.")
    return value


def positive(text: str) -> float:
    """An argparse ``type`` for a finite number > 0 (a cost limit)."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0. Got {text!r} instead.")
    return value


def port(text: str) -> int:
    """An argparse ``type`` for a TCP port, 0-65535 (0: a free one)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535 (0 picks a free one). Got {text!r} instead.")
    return value


def _argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type``: the :class:`UsageError` it raises (a library's own check)
    becomes argparse's one-line message instead of argparse's generic "invalid value"."""
    @functools.wraps(parse)
    def checked(text: str) -> T:
        try:
            return parse(text)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return checked


@_argument_type
def domain_adjustment(text: str) -> float:
    """An argparse ``type`` for the fraction the tier thresholds are lowered by (the rule of core/tiers.py)."""
    from weknora_nb.core.tiers import check_domain_adjustment

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number. Got {text!r} instead.") from None
    check_domain_adjustment(value)
    return value


@_argument_type
def notebook_names(text: str) -> tuple[str, ...]:
    """An argparse ``type`` for comma-separated notebook names (``NOTEBOOKS`` of weknora_nb/reports/render.py),
    each once, in the order given."""
    from weknora_nb.reports.render import NOTEBOOKS

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in NOTEBOOKS for n in names):
        raise UsageError(argument="each name", allowed=NOTEBOOKS, got=text)
    return names


@_argument_type
def metric_names(text: str) -> str:
    """An argparse ``type`` for one or more comma-separated metric names, each checked by ``parse_metric``."""
    from weknora_nb.core.metrics import parse_metric

    names = [n for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"needs metric names such as ndcg@10 or recall@5,hit@5. Got {text!r} instead.")
    for name in names:
        parse_metric(name)  # a MetricError is a UsageError
    return text


@_argument_type
def bound(text: str) -> str:
    """An argparse ``type`` for a gate bound ``METRIC=VALUE`` (checked by ``parse_bounds``)."""
    from weknora_nb.analysis.gate import parse_bounds

    parse_bounds([text])
    return text


@_argument_type
def margin(text: str) -> str:
    """An argparse ``type`` for an evidence bound ``METRIC=MARGIN`` (a margin >= 0)."""
    from weknora_nb.analysis.gate import parse_bounds

    parse_bounds([text], what="margin", minimum=0.0)
    return text


@_argument_type
def effect(text: str) -> str:
    """An argparse ``type`` for ``--detect METRIC=EFFECT`` (an effect other than 0)."""
    from weknora_nb.analysis.gate import parse_bounds

    if not any(parse_bounds([text], what="effect").values()):
        raise argparse.ArgumentTypeError(f"the effect to detect must not be 0, e.g. ndcg@5=0.02. Got {text!r} instead.")
    return text


def base_url(text: str) -> str:
    """An argparse ``type`` for WeKnora's base URL: http or https, with a host."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != -1
    except ValueError:  # a port that is not a number or out of range, a bracket that is not closed
        ok = False
    if not ok:
        from weknora_nb.collect.http.redact import redact_url  # only now: it loads the collect package

        raise argparse.ArgumentTypeError("must be an http:// or https:// URL with a host, e.g. "
                                         f"http://127.0.0.1:8080. Got {redact_url(text)!r} instead.")
    return text


def faults(text: str) -> dict[str, Any]:
    """An argparse ``type`` for the sandbox's faults: a JSON object of fault settings, each checked by
    ``FaultConfig.from_dict`` (a rate in [0, 1], any other number in its range, ``seed`` an integer or null)."""
    from weknora_nb.sandbox.faults import FaultConfig

    example = '{"latency_ms": 50, "error_rate": 0.05}'
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead "
                                         f"({exc.msg} at column {exc.colno}).") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got a JSON text nested "
                                         "too deeply instead.") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as {example}. Got {text!r} instead.")
    try:
        FaultConfig.from_dict(data)  # every setting checked there: its name, type and range
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return data


@_argument_type
def since(text: str) -> Any:
    """An argparse ``type`` for ``--since``: a date or a date and time (``parse_since``)."""
    from weknora_nb.collect.history import parse_since

    return parse_since(text)


def check_run_folder(argument: str, path: str) -> None:
    """Raise :class:`RunFolderError` naming ``argument`` when ``path`` holds no readable run manifest."""
    from weknora_nb.core.run import read_manifest

    try:
        read_manifest(path)
    except RunFolderError as exc:
        raise RunFolderError(f"{argument}: {exc}") from None


def output_file(text: str) -> str:
    """An argparse ``type`` for a file the command writes: not an existing folder (nor a path ending in a
    separator), so that the command refuses it before any work rather than failing on it at the end."""
    import os
    from pathlib import Path

    if text.endswith(("/", os.sep)) or Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"must name a file to write, not a folder. Got {text!r} instead.")
    return text
