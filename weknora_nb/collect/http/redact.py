"""Secrets out of URLs before anything shows them: log lines, error messages, files.

A base URL may carry a secret: ``http://user:PASSWORD@host/`` (HTTP basic auth) or
``https://host/?token=SECRET`` (a gateway's token). :func:`redact_url` replaces the password
with ``***`` (a user name alone, often a token, too) and the value of every query or fragment
parameter whose name looks secret (:data:`SECRET_PARAMETER`: token, key, api_key, apikey,
password, secret, signature, sig, access_token, auth, ...). :func:`redact_text` does it to
every URL (and a Postgres connection string's ``password=``; :func:`redact_dsn` for a DSN of either
form) in a text, and :class:`RedactingFilter` to every log record of the loggers
:func:`install_log_redaction` fits it on: httpx's own ``HTTP Request: ...`` line, httpcore's,
and ours.

Nothing here imports httpx: the command line may use it before any request library is loaded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
#: a query parameter name that looks secret (matched case-insensitively, ``-`` read as ``_``)
SECRET_PARAMETER = re.compile(
    r"(^|_)(sig|auth)$|token|key|password|passwd|pwd|secret|signature|authori[sz]ation|credential|session",
    re.IGNORECASE)
#: the loggers whose records :func:`install_log_redaction` redacts (a filter on a logger does not
#: see its children's records, so httpcore's children are named one by one)
REDACTED_LOGGERS = ("httpx", "httpcore", "httpcore.connection", "httpcore.http11", "httpcore.http2",
                    "httpcore.proxy", "httpcore.socks", "weknora_nb")
#: a URL inside a text: a scheme, ``://``, then anything up to a space or a quote
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
#: ``user:password@host`` inside a text, without a scheme (a user name alone may be an e-mail address: kept)
_USERINFO_IN_TEXT = re.compile(r"(?<![^\s'\"(=,;])([^\s:/@'\"]+):(?!\*\*\*@)[^\s/@'\"]+@(?=[\w\[])")
#: a query parameter inside a text: after "?" or "&", a name, "=", a value up to a separator
_PARAMETER_IN_TEXT = re.compile(r"([?&])([^=&\s#'\"<>]+)=([^&\s#'\"<>]*)")
#: a secret of a libpq key=value connection string (``password=x``, ``password = 'a b'``, ``sslpassword=x``)
_DSN_SECRET_IN_TEXT = re.compile(r"(?<![\w?&])((?:ssl)?password|passwd|pwd)(\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s'\"&]+)",
                                 re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its secrets replaced by ``***``: the password of its user info (a user name
    given alone too), and the values of the query and fragment parameters whose names look secret.

    ``http://bob:s3cret@h:8080/api?token=t&page=2`` -> ``http://bob:***@h:8080/api?token=***&page=2``.
    Everything else is kept as written. A text that is not a URL with ``//`` (``user:pw@host:8080``)
    is masked the same way.
    """
    if not isinstance(url, str):
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host: mask the way a text without "//" is masked
        parts = None
    if parts is None or not parts.netloc:
        head, sep, tail = url.partition("?")
        head = re.sub(r"^([^/@]*//)?([^/@]*)@", lambda m: (m.group(1) or "") + _masked_userinfo(m.group(2)), head)
        return head + sep + _redact_parameters(tail) if sep else head
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = _masked_userinfo(userinfo) + hostport
    return urlunsplit((parts.scheme, netloc, parts.path, _redact_parameters(parts.query),
                       _redact_parameters(parts.fragment)))


def _masked_userinfo(userinfo: str) -> str:
    """``user:password`` -> ``user:***@``; a user name alone (often a token) -> ``***@``."""
    user, colon, _password = userinfo.partition(":")
    return f"{user}:{MASK}@" if colon else f"{MASK}@"


def _redact_parameters(query: str) -> str:
    """``a=1&token=x`` -> ``a=1&token=***``: the value of each parameter whose name looks secret, masked."""
    if not query:
        return query
    pairs = []
    for pair in query.split("&"):
        name, eq, _value = pair.partition("=")
        looks_secret = SECRET_PARAMETER.search(unquote(name).replace("-", "_")) is not None
        pairs.append(f"{name}={MASK}" if eq and looks_secret else pair)
    return "&".join(pairs)


def settings_repr(settings: Any) -> str:
    """``Name(field=value, ...)`` of a settings dataclass with its ``base_url`` redacted (:func:`redact_url`)."""
    shown = ", ".join(f"{f.name}={redact_url(v) if f.name == 'base_url' else v!r}" for f in fields(settings)
                      for v in [getattr(settings, f.name)])
    return f"{type(settings).__name__}({shown})"


def check_http_url(url: Any, *, argument: str) -> None:
    """A :class:`UsageError` naming ``argument`` unless ``url`` is an http:// or https:// URL with a host and a
    valid port (the URL shown redacted)."""
    from weknora_nb.core.errors import UsageError

    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != -1
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(argument=argument, allowed="an http:// or https:// URL with a host, e.g. "
                         "http://127.0.0.1:8080/v1", got=redact_url(str(url)))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`), every secret-looking parameter of a
    query string without its URL (``/api?token=x``), and the password of a libpq key=value connection
    string (``password=x`` -> ``password=***``)."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    text = _USERINFO_IN_TEXT.sub(rf"\1:{MASK}@", text)
    text = _PARAMETER_IN_TEXT.sub(_masked_parameter, text)
    return _DSN_SECRET_IN_TEXT.sub(rf"\1\2{MASK}", text)


def redact_dsn(dsn: str) -> str:
    """A Postgres connection string as it may be shown: its password masked, in either form libpq reads.

    ``host=h dbname=kb user=bob password='s e'`` -> ``host=h dbname=kb user=bob password=***``;
    ``postgresql://bob:s3cret@h:5432/kb?sslpassword=x`` -> ``postgresql://bob:***@h:5432/kb?sslpassword=***``.
    """
    if not isinstance(dsn, str):
        return dsn
    return redact_text(dsn) if "://" in dsn else _DSN_SECRET_IN_TEXT.sub(rf"\1\2{MASK}", dsn)


def _masked_parameter(m: re.Match[str]) -> str:
    looks_secret = SECRET_PARAMETER.search(unquote(m.group(2)).replace("-", "_")) is not None
    return f"{m.group(1)}{m.group(2)}={MASK}" if looks_secret else m.group(0)


def redact_command(argv: Sequence[str]) -> list[str]:
    """A command line as it may be shown or recorded: every URL in its arguments redacted."""
    return [redact_text(str(a)) for a in argv]


class RedactingFilter(logging.Filter):
    """A filter that lets every record through with the URLs of its message redacted.

    The message is formatted once (``msg % args``) and the redacted text put in its place, so
    a URL passed as an argument (httpx passes ``httpx.URL`` objects) is redacted too.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own error handling
            return True
        redacted = redact_text(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, ()
        return True


_FILTER = RedactingFilter()


def install_log_redaction(loggers: Iterable[str] = REDACTED_LOGGERS,
                          handlers: Iterable[logging.Handler] = ()) -> None:
    """Fit the redacting filter on ``loggers`` (the HTTP libraries' and ours) and on ``handlers`` (a
    handler's filter sees the records of every logger it serves); once each, however often called."""
    for target in [*(logging.getLogger(name) for name in loggers), *handlers]:
        if not any(isinstance(f, RedactingFilter) for f in target.filters):
            target.addFilter(_FILTER)

