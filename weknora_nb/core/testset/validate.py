"""The rules a test-set record must follow, and the two checks that apply them.

A record (docs/method.md section 1) is sound when

- ``query_id`` is a string (or an integer, read as its decimal text) that strips to something;
- ``query`` is a string that strips to something; ``query_type``, when given, too;
- ``relevant`` maps chunk ids (strings that strip to something, each once) to grades, integers in
  :data:`GRADES` (integral floats accepted, bools and text not);
- ``tags``, when given, is a list of strings that strip to something; ``answer``, when given, a string;
- ``weight``, when given, is an integer from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT` (integral floats
  accepted);
- ``source``, when given, is a string that strips to something (where the query came from: ``traffic`` for
  ``testset sample``, :data:`SYNTHETIC` for ``testset generate``); ``overlap``, when given, a finite number
  from 0 to 1 (the share of the query's tokens found in its source chunk, docs/method.md section 17);
- no key is written twice, and no text holds an unpaired surrogate (JSON's ``\\ud800``: not text).

Two checks apply these rules and must agree:

- :func:`check_record`, one record at a time, names every problem by field (``bad(field, message)``);
- :func:`bulk_columns` (and :func:`bulk_fields`), many records at once, a few passes over each field and
  no Python function per record, gives the columns of the records when every one is plainly sound, and
  None otherwise: it reports nothing, so it only ever accepts what :func:`check_record` accepts, with the
  same result. A batch it refuses is checked record by record.

Both read the rules from the constants and helpers below (:data:`GRADES` through :func:`grades_in_range`,
:data:`MIN_WEIGHT`, :data:`MAX_WEIGHT`, :data:`KNOWN_FIELDS`, :func:`log_ignored_fields`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from weknora_nb.core.arrowtext import TEXT, text_offsets
from weknora_nb.core.testset.parsing import Bad, Repeated

log = logging.getLogger(__name__)

# -- the rules, read by both checks ------------------------------------------------------
#: grades: 3 fully relevant, 2 highly relevant, 1 partly relevant, 0 not relevant
GRADES = (0, 1, 2, 3)
#: a traffic weight (how often the query was asked): an integer from 1 to what int64 holds
MIN_WEIGHT, MAX_WEIGHT = 1, 2**63 - 1
#: the ``source`` of a generated query (docs/method.md section 17), and of one sampled from real traffic
SYNTHETIC, TRAFFIC = "synthetic", "traffic"
KNOWN_FIELDS = {"query_id", "query", "relevant", "query_type", "tags", "answer", "weight", "source", "overlap"}
REQUIRED = ("query_id", "query", "relevant")
SAME_ONCE_STRIPPED = "are the same id once surrounding whitespace is removed"
_SURROGATE = re.compile("[\ud800-\udfff]")
_NONE = type(None)


def grades_in_range(lowest: Any, highest: Any) -> bool:
    """Whether integer grades from ``lowest`` to ``highest`` are all grades (:data:`GRADES` has no gap)."""
    return GRADES[0] <= lowest and highest <= GRADES[-1]


def grade(value: Any) -> int | None:
    """An integer grade (integral floats accepted, bools and strings not); None when it is none."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value in GRADES:
        return value
    return None


def _weight(value: Any) -> int | None | bool:
    """A traffic weight: None when absent, an integer (integral floats accepted), False when bad."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and value <= MAX_WEIGHT:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_WEIGHT <= value <= MAX_WEIGHT:
        return False
    return value


def _overlap(value: Any) -> float | None | bool:
    """A lexical overlap: None when absent, a float from 0 to 1 (integers 0 and 1 accepted), False when bad."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:  # NaN fails too
        return False
    return float(value)


def log_ignored_fields(obj: dict, path: str, where: str, line: int) -> None:
    """Log (DEBUG) the fields of a sound record outside :data:`KNOWN_FIELDS`: they are ignored."""
    if not KNOWN_FIELDS.issuperset(obj):
        log.debug("%s %s %d: ignoring unknown field(s) %s", path, where, line,
                  sorted(map(str, set(obj) - KNOWN_FIELDS)))


def _bad_text(s: str) -> bool:
    """True when ``s`` holds an unpaired surrogate (JSON's ``\\ud800``): it is not text and has no UTF-8 form."""
    return not s.isascii() and _SURROGATE.search(s) is not None


# -- messages --------------------------------------------------------------------------
def show(v: Any) -> str:
    """``repr(v)`` for a problem message: at most 80 characters; an integer too long to print says so."""
    try:
        text = repr(v)
    except ValueError:   # an integer of more digits than Python prints (sys.get_int_max_str_digits)
        return "an integer too long to print"
    return text if len(text) <= 80 else text[:77] + "..."


def same_id(what: str, first: str, later: str, first_at: int, where: str) -> str:
    """The message for an id met twice: the same spelling, or two that differ only by surrounding whitespace."""
    if first == later:
        return f"duplicate {what[:-1]} {later.strip()!r} (first on {where} {first_at})"
    return f"{what} {first!r} ({where} {first_at}) and {later!r} {SAME_ONCE_STRIPPED}; keep one spelling"


def _type_name(v: Any) -> str:
    return "dict" if isinstance(v, Repeated) else type(v).__name__


def _surrogate_message(s: str) -> str:
    ch = _SURROGATE.search(s).group()  # type: ignore[union-attr]
    return f"contains an unpaired surrogate {ch!r} (not valid Unicode text)"


# -- one record at a time ---------------------------------------------------------------
def _check_repeats(obj: Repeated, bad: Bad) -> None:
    """A problem for each key a JSON record writes twice (the last value would silently win)."""
    seen: dict[Any, Any] = {}
    for key, value in obj.pairs:
        if key in seen:
            bad(str(key), f"appears twice in the record (values {show(seen[key])} and {show(value)}); "
                          "a JSON object's keys must be unique")
        else:
            seen[key] = value


def _check_id(value: Any, field: str, bad: Bad, check_text: bool) -> tuple[str, str] | None:
    """(stripped id, id as written) of a query id (a string or an integer), or None (problem recorded)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        bad(field, "missing" if value is None else f"must be a string, got {_type_name(value)}")
        return None
    if isinstance(value, int):
        try:
            value = str(value)
        except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
            bad(field, "must be a string, got an integer too long to be an id")
            return None
    key = value.strip()
    if not key:
        bad(field, "must not be empty")
        return None
    if check_text and _bad_text(key):
        bad(field, _surrogate_message(key))
        return None
    return key, value


_INT, _STR = {int}, {str}


def _check_relevant(rel: Any, bad: Bad, check_text: bool) -> tuple[list[str], list[int]] | None:
    """(chunk ids, grades) of a ``relevant`` mapping, or None (problems recorded)."""
    if type(rel) is dict:   # the common case, checked in bulk: str ids already stripped, int grades in range
        if not rel:
            return [], []
        cids, grades = list(rel), list(rel.values())
        if (set(map(type, grades)) == _INT and grades_in_range(min(grades), max(grades))
                and set(map(type, cids)) == _STR and "" not in cids and cids == [c.strip() for c in cids]
                and not (check_text and any(map(_bad_text, cids)))):
            return cids, grades
    if not isinstance(rel, dict):
        bad("relevant", "missing (use {} for a query with no relevant chunk)" if rel is None
            else f"must be an object mapping chunk id to grade, got {_type_name(rel)}")
        return None
    return _check_labels(rel.pairs if isinstance(rel, Repeated) else rel.items(), bad)


def _check_labels(items: Iterable[tuple[Any, Any]], bad: Bad) -> tuple[list[str], list[int]] | None:
    """:func:`_check_relevant` one label at a time, naming each problem (a chunk twice, a bad grade...)."""
    ok = True
    cids: list[str] = []
    grades: list[int] = []
    first: dict[str, tuple[str, int]] = {}
    for cid, value in items:
        if not isinstance(cid, str) or not cid.strip():
            bad("relevant", f"chunk id must be a non-empty string, got {show(cid)}")
            ok = False
            continue
        key = cid.strip()
        g = grade(value)
        if g is None:
            bad("relevant", f"grade of chunk {cid!r} must be an integer 0-3, got {show(value)}")
            ok = False
            continue
        if _bad_text(key):
            bad("relevant", f"chunk id {key!r} {_surrogate_message(key)}")
            ok = False
            continue
        if key in first:
            spelled, g0 = first[key]
            bad("relevant", f"chunk {cid!r} is labelled twice (grades {g0} and {g}); give each chunk one grade"
                if spelled == cid else
                f"chunk ids {spelled!r} and {cid!r} {SAME_ONCE_STRIPPED} (grades {g0} and {g}); keep one spelling")
            ok = False
            continue
        first[key] = (cid, g)
        cids.append(key)
        grades.append(g)
    return (cids, grades) if ok else None


def _check_text(obj: dict, name: str, bad: Bad, check_text: bool, required: bool) -> tuple[bool, str | None]:
    """(sound, stripped value) of an optional (or ``required``) non-empty text field."""
    v = obj.get(name)
    if v is None:
        if required:
            bad(name, "missing")
        return not required, None
    if not isinstance(v, str):
        bad(name, f"must be a string, got {_type_name(v)}" if required
            else f"must be a non-empty string, got {show(v)}")
        return False, None
    t = v.strip()
    if not t:
        bad(name, "must not be empty" if required else f"must be a non-empty string, got {show(v)}")
        return False, None
    if check_text and _bad_text(t):
        bad(name, _surrogate_message(t))
        return False, None
    return True, t


def _check_tags(tags: Any, bad: Bad, check_text: bool) -> list | None:
    """The tags as given (none: an empty list), or None (problem recorded)."""
    if tags is None:
        return []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags) or (
            check_text and any(map(_bad_text, tags))):
        bad("tags", f"must be a list of non-empty strings, got {show(tags)}")
        return None
    return tags


def _check_answer(answer: Any, bad: Bad, check_text: bool) -> bool:
    """Whether ``answer`` is absent or text (problem recorded when not)."""
    if answer is not None and (not isinstance(answer, str) or (check_text and _bad_text(answer))):
        bad("answer", f"must be a string, got {_type_name(answer)}" if not isinstance(answer, str)
            else _surrogate_message(answer))
        return False
    return True


def check_record(obj: Any, bad: Bad, check_text: bool = True) -> tuple | None:
    """Check one raw record: ``(query_id, id as written, query, chunk ids, grades, query_type, tags, answer,
    weight, source, overlap)``, or None (problems given to ``bad(field, message)``). ``check_text=False``: the
    strings cannot hold an unpaired surrogate (they were decoded from UTF-8 or come from Arrow)."""
    if not isinstance(obj, dict):
        bad(None, f"expected a JSON object, got {type(obj).__name__}")
        return None
    ok = not isinstance(obj, Repeated)
    if not ok:
        _check_repeats(obj, bad)  # type: ignore[arg-type]
    qid = _check_id(obj.get("query_id"), "query_id", bad, check_text)
    ok_text, text = _check_text(obj, "query", bad, check_text, True)
    labels = _check_relevant(obj.get("relevant"), bad, check_text)
    ok_type, qtype = _check_text(obj, "query_type", bad, check_text, False)
    tags = _check_tags(obj.get("tags"), bad, check_text)
    ok = _check_answer(obj.get("answer"), bad, check_text) and tags is not None and ok
    weight = _weight(obj.get("weight"))
    if weight is False:
        bad("weight", f"must be an integer >= 1 (how often the query was asked), got {show(obj.get('weight'))}")
        ok = False
    ok_source, source = _check_text(obj, "source", bad, check_text, False)
    overlap = _overlap(obj.get("overlap"))
    if overlap is False:
        bad("overlap", f"must be a number from 0 to 1 (the share of the query's tokens found in its source chunk), "
                       f"got {show(obj.get('overlap'))}")
        ok = False
    if not (ok and ok_text and ok_type and ok_source) or qid is None or labels is None:
        return None
    tags = [t.strip() for t in tags] if tags else tags
    return qid[0], qid[1], text, labels[0], labels[1], qtype, tags, obj.get("answer"), weight, source, overlap


# -- many records at once ---------------------------------------------------------------
def field_values(objs: list[dict], name: str, present: set[str] | None = None) -> list[Any]:
    """``obj.get(name)`` of each record; ``present``: every key any record holds (a field none holds is all
    None at once, and one every record holds is read without a default)."""
    if present is not None and name not in present:
        return [None] * len(objs)
    try:
        return list(map(itemgetter(name), objs))
    except KeyError:   # a record without it
        return list(map(dict.get, objs, repeat(name)))


def _bulk_text(values: list[Any], *, optional: bool) -> list[Any] | None:
    """The stripped values of a text field when each is a non-empty string (or None, when ``optional``),
    else None."""
    types = set(map(type, values))
    out: list[Any]
    if types == {str}:
        out = list(map(str.strip, values))
    elif optional and types == {_NONE}:
        return values
    elif optional and types == {str, _NONE}:
        out = [v if v is None else v.strip() for v in values]
    else:
        return None
    return None if "" in out else out


def _bulk_ids(values: list[Any]) -> tuple[list[str], list[str]] | None:
    """(stripped ids, ids as written) of the query ids when each is a string or an integer that strips to
    something, else None."""
    types = set(map(type, values))
    if types == {str}:
        spelled = values
    elif types <= {str, int}:
        spelled = [v if type(v) is str else str(v) for v in values]   # ValueError: too many digits
    else:
        return None
    key = list(map(str.strip, spelled))
    return None if "" in key else (key, spelled)


def _bulk_labels(rel: list[Any]) -> tuple[np.ndarray, pa.Array, np.ndarray] | None:
    """(labels per record, chunk ids as Arrow text, grades) when each ``relevant`` is a plain dict of stripped,
    non-empty string ids to integer grades, else None. A chunk id with a lone surrogate raises
    UnicodeEncodeError."""
    if set(map(type, rel)) != {dict}:
        return None
    n_lab = np.array(list(map(len, rel)), np.int64)
    cids = list(chain.from_iterable(rel))
    grades = list(chain.from_iterable(map(dict.values, rel)))
    if set(map(type, cids)) - {str} or set(map(type, grades)) - {int}:
        return None
    ids = pa.array(cids, TEXT)
    if _blank_or_padded(ids, cids):
        return None
    g = np.fromiter(grades, np.int64, len(grades))   # OverflowError: an integer past int64
    return (n_lab, ids, g.astype(np.int8)) if not len(g) or grades_in_range(g.min(), g.max()) else None


#: the first and the last byte of a string that ends in whitespace as Python strips it: an ASCII space or control
#: character, or the lead or last byte of a character written in more than one byte (U+0085, U+00A0, U+2000...)
_MAY_PAD = np.zeros(256, bool)
_MAY_PAD[[*range(0x21), 0x7F, *range(0x80, 0x100)]] = True


def _blank_or_padded(ids: pa.Array, values: list[str]) -> bool:
    """Whether any of ``values`` (``ids``: the same, as Arrow text) is empty or not stripped (``str.strip``
    would change it). Only the strings whose first or last byte may belong to whitespace are stripped in
    Python; the bytes of the others are looked at once."""
    if not len(ids):
        return False
    offsets = text_offsets(ids)
    if (offsets[1:] == offsets[:-1]).any():
        return True
    data = np.frombuffer(ids.buffers()[2], np.uint8)
    maybe = np.flatnonzero(_MAY_PAD[data[offsets[:-1]]] | _MAY_PAD[data[offsets[1:] - 1]])
    return any(values[i].strip() != values[i] for i in maybe.tolist())


def _bulk_tags(tags: list[Any]) -> pa.Array | None:
    """The tags column (stripped lists; none given: an empty list) when each record's ``tags`` is missing or
    a list of strings that strip to something, else None."""
    types = set(map(type, tags))
    if types == {_NONE}:
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(tags) + 1, np.int32)), pa.array([], TEXT))
    if not types <= {list, _NONE}:
        return None
    lists = tags if _NONE not in types else [t or [] for t in tags]
    flat = list(chain.from_iterable(lists))
    if flat and set(map(type, flat)) != {str}:
        return None
    flat = list(map(str.strip, flat))
    if "" in flat:
        return None
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, lists), np.int64, len(lists)), out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, TEXT))


def _bulk_overlap(values: list[Any]) -> pa.Array | None:
    """The overlap column (float64, null where none is given) when each value is None or a number from 0 to 1
    (not a bool), else None."""
    types = set(map(type, values))
    if types == {_NONE}:
        return pa.nulls(len(values), pa.float64())
    if not types <= {float, int, _NONE}:
        return None
    arr = pa.array([None if v is None else float(v) for v in values], pa.float64())
    if arr.null_count < len(arr) and not (pc.min(arr).as_py() >= 0 and pc.max(arr).as_py() <= 1
                                          and not pc.any(pc.is_nan(arr)).as_py()):
        return None
    return arr


def bulk_columns(objs: list[Any]) -> dict[str, Any] | None:
    """The builder's columns (Arrow arrays) of many records checked at once, when every record is plainly
    sound: exactly what :func:`check_record` keeps of each, with no problem to report. None when any
    record needs its own look (a problem to name, an unusual type, an unpaired surrogate...):
    nothing here reports a problem, so this path only ever accepts what the record-by-record one accepts."""
    if not objs or set(map(type, objs)) != {dict}:   # a Repeated (a key written twice), or not an object
        return None
    present: set[str] = set().union(*objs)
    if not KNOWN_FIELDS.issuperset(present) and log.isEnabledFor(logging.DEBUG):
        return None   # each record logs the fields it ignores (log_ignored_fields)
    return bulk_fields(lambda name: field_values(objs, name, present), len(objs))


def bulk_fields(field: Callable[[str], list[Any]], n: int) -> dict[str, Any] | None:
    """:func:`bulk_columns` of ``n`` records given field by field: ``field(name)`` is each record's value
    (None where it has none)."""
    try:
        ids, text = _bulk_ids(field("query_id")), _bulk_text(field("query"), optional=False)
        labels = _bulk_labels(field("relevant"))
        qtype, source = _bulk_text(field("query_type"), optional=True), _bulk_text(field("source"), optional=True)
        answer, weight, overlap = field("answer"), field("weight"), _bulk_overlap(field("overlap"))
        if ids is None or text is None or labels is None or qtype is None or source is None or overlap is None \
                or not set(map(type, answer)) <= {str, _NONE} or not set(map(type, weight)) <= {int, _NONE}:
            return None
        tags = _bulk_tags(field("tags"))
        if tags is None:
            return None
        # text becomes UTF-8 here: an unpaired surrogate raises (UnicodeEncodeError), as a weight past
        # MAX_WEIGHT (what int64 holds) does
        weights = pa.array(weight, pa.int64())
        cols = {"query_id": pa.array(ids[0], TEXT), "query": pa.array(text, TEXT),
                "query_type": pa.array(qtype, TEXT), "answer": pa.array(answer, TEXT), "weight": weights,
                "source": pa.array(source, TEXT), "overlap": overlap,
                "tags": tags, "chunk_id": labels[1]}
    except (UnicodeEncodeError, ValueError, OverflowError, pa.ArrowException):
        return None
    if weights.null_count < len(weights) and pc.min(weights).as_py() < MIN_WEIGHT:
        return None
    n_lab, _, grades = labels
    label_q = np.repeat(np.arange(n, dtype=np.int64), n_lab)
    cols.update(n_labelled=n_lab, grade=grades, label_query=cols["query_id"].take(pa.array(label_q)),
                n_relevant=np.bincount(label_q, weights=grades > 0, minlength=n).astype(np.int64),
                spelled={i: w for i, (k, w) in enumerate(zip(*ids, strict=True)) if k != w}
                if ids[0] != ids[1] else {})
    return cols
