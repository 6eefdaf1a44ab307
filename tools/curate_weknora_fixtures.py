"""Curate recordings of a running WeKnora Lite v0.7.2 into the replay fixtures of ``tests/fixtures/weknora-v0.7.2/``.

The recordings were made by hand against WeKnora Lite built from the v0.7.2 tag (what was run and how:
``tests/fixtures/weknora-v0.7.2/README.md``); they are not in this repository, and nothing here builds or runs
WeKnora. This script only selects and trims them, so that what the README says was trimmed can be checked::

    python tools/curate_weknora_fixtures.py RECORDINGS_DIR CLIENT_RECORDINGS_DIR [--out tests/fixtures/weknora-v0.7.2]

``RECORDINGS_DIR`` holds one JSON per interaction recorded by hand (request, status, headers, parsed body or
the raw SSE text); ``CLIENT_RECORDINGS_DIR`` the interactions of weknora-nb's own runs, recorded by a proxy
(the same, plus the raw bytes of every body), named ``<label>-<seq>.json``.

What it writes, per interaction, ``<name>.json``: ``weknora`` (version, commit, edition, stream manager),
``name``, ``note``, ``source`` (the recording's file), ``trimmed`` (what was cut, in words), ``request``
(``method``, ``path``, ``query`` as a list of [name, value] pairs or null, ``body`` as JSON or ``body_text``,
``auth``: which credentials were sent, never their value) and ``response`` (``status``, ``headers``: the
content type and request id, and for SSE the stream headers; ``body`` as JSON, ``body_text`` for a body that
is not JSON, or ``sse``: the file ``<name>.sse`` holding the stream's bytes; ``stays_open``: the server had not
closed the stream when the recording client gave up). The trimming:

- ``metadata.content`` (the whole markdown of a manual knowledge, which WeKnora copies into every search hit,
  knowledge-search result, chat reference and knowledge object) is cut to its first :data:`KEEP` characters
  followed by :data:`MARKER`; nothing else of a body is changed;
- an SSE stream is rewritten line by line: each ``data:`` line is parsed, trimmed so, and written back as Go's
  ``encoding/json`` writes it (checked to give back every untrimmed line byte for byte); every other byte is
  the recorded one. In a ``references`` event whose ``data.references`` repeats ``knowledge_references`` item
  for item (the memory stream manager's; with Redis they differ and both are kept whole), each copy's ``content``
  is cut to :data:`KEEP` characters followed by :data:`COPY_MARKER` (the full text is in ``knowledge_references``);
- request headers are dropped (``auth`` says whether ``X-API-Key`` / ``Authorization`` were sent); the one
  password of a request body (the registration of 01a) is replaced by ``<redacted>``; response headers other
  than those named above are dropped (the replay server writes its own ``Content-Length`` / chunking);
- a collection scenario keeps one copy of an interaction repeated with the same request and the same answer
  (the replay server answers it again each time).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shutil
from pathlib import Path
from typing import Any

#: the characters of ``metadata.content`` kept
KEEP = 200
#: what follows a cut ``metadata.content`` ({n}: the length recorded)
MARKER = "…[weknora-nb fixture: metadata.content cut to 200 of {n} characters]"
#: what follows the cut ``content`` of a ``data.references`` item that repeats its ``knowledge_references`` item
COPY_MARKER = "…[weknora-nb fixture: a copy of knowledge_references[{i}].content, cut to 200 of {n} characters]"
WEKNORA = {"version": "v0.7.2", "commit": "3d5d8bfcdfeeea266b292b71cea616847af28d0f", "edition": "lite"}

#: the hand recordings kept, by file name (without .json); the rest are not needed by the tests (registration
#: and login with their secrets, model and knowledge base creation, the 20-question sweep, summaries)
INTERACTIONS = [
    "01a-auth-register-unpatched-sqlite-schema", "04-system-info", "09-model-get-embedding",
    "16-kb-detail-parent-child", "17-kb-detail-flat", "18-kb-detail-faq", "19-kb-list",
    "20c-knowledge-list-pagesize-1001", "20d-knowledge-list-faq-kb", "21-knowledge-detail-manual",
    "22-chunks-pc-default", "22c-chunks-pc-pagesize-200", "22d-chunks-pc-parent_text", "22e-chunks-pc-summary",
    "22g-chunks-flat-default", "23-chunks-faq-default-text", "23c-chunk-by-id-unknown",
    "24-tenant-retrieval-config-get", "30-hybrid-post-query-only", "31-hybrid-post-thr0-mc10",
    "32-hybrid-get-thr0-mc10", "34-hybrid-post-vector-only", "34b-hybrid-post-vector-only-thr0.5",
    "35-hybrid-post-keyword-only", "35b-hybrid-post-keyword-only-thr0.9", "36-hybrid-post-flat-thr0-mc10",
    "37-hybrid-post-faq-kb", "39-hybrid-post-skip-enrichment", "39b-hybrid-post-mc0-explicit",
    "39c-hybrid-post-mc-negative", "40-knowledge-search-pc", "40b-knowledge-search-flat",
    "40c-knowledge-search-pc-and-flat", "40d-knowledge-search-faq", "41-faq-search-match-count-only",
    "41b-faq-search-thr0.3", "41c-faq-search-thr0.01", "41d-faq-search-thr0.7", "47-q20-q0035-knowledge-search-pc",
    "50-session-create-empty-object", "50b-session-create-no-body", "50c-session-get",
    "52a-chat-quick-answer-agent-model-unset", "53-chat-ui-body", "54-chat-greeting-no-agent",
    "54b-chat-greeting-quick-answer", "55-chat-chitchat-no-agent", "57-chat-faq-quick-answer", "58-session-delete",
    "58b-session-get-after-delete", "59-agent-get-quick-answer-default", "61b-chat-quick-answer-with-rerank",
    "61d-chat-quick-answer-rerank-500",
    "70-error-no-credentials", "71-error-bad-api-key", "71b-error-bad-bearer-no-key", "71c-error-api-key-as-bearer",
    "72-error-unknown-kb-hybrid", "72b-error-unknown-kb-detail", "72c-error-unknown-kb-knowledge-search",
    "73-error-bad-json-hybrid", "73b-error-wrong-type-hybrid", "73c-error-empty-query-hybrid",
    "73d-error-knowledge-search-no-scope", "73e-error-knowledge-search-empty-query", "74-error-chat-unknown-session",
    "74b-error-chat-empty-query", "75-error-unknown-route", "75b-error-chunks-unknown-knowledge",
    "75c-error-knowledge-unknown", "76-error-faq-search-on-document-kb", "76b-error-retrieval-config-unknown-key",
    "80-embed429-hybrid-search", "81-embed429-knowledge-search", "81b-embed429-knowledge-search-faq",
    "82-embed429-faq-search", "92-hybrid-two-kbs-different-models",
    "92c-hybrid-two-kbs-different-models-keyword-only", "95-index-status-before", "95b-index-status-processing",
    "95c-index-status-chunk-list", "95e-index-status-knowledge-search", "111-chat-llm-stream-cut",
]

#: the proxy's labels that are collections (each a folder of its own), with the stream manager Lite ran
SCENARIOS = {"collect-pc": "memory", "collect-faq": "memory", "collect-mixed": "memory",
             "collect-embed429": "memory", "collect-redis": "redis"}
#: single calls recorded by the proxy (weknora-nb's client, or a chat read to its end with the client's bodies),
#: by (label, sequence number)
CLIENT_CALLS = {("client", 172): "c1-model-get-use-multilingual", ("client", 173): "c2-model-get-hash-embed-256",
                ("client", 174): "c3-models-list", ("client", 175): "c4-chunks-mini-with-parent_text-1",
                ("client", 176): "c5-chunks-mini-with-parent_text-2",
                ("client", 177): "c6-chunks-mini-with-parent_text-3",
                ("faqchat429", 1): "c7-session-create", ("faqchat429", 2): "c8-chat-faq-embed429",
                ("client2", 3): "c9-chunks-hash256-with-parent_text-1",
                ("client2", 4): "c10-chunks-hash256-with-parent_text-2", ("client3", 87): "c11-memory-config"}
#: recordings of the proxy added at the end of a collection's folder (requests a client may make in that run,
#: with the same server state: the FAQ search with the threshold sent)
SCENARIO_EXTRAS = {"collect-faq": "collect-faq-extra"}
#: requests recorded with the same answer as a collection's recording, (label, seq) -> (label, seq): kept as that
#: recording's ``also_requests`` (the FAQ knowledge's listing asking for parent_text too: it has none)
ALSO = {("client", 178): ("collect-faq", 119), ("client", 179): ("collect-faq", 120)}


#: the note of what the recording proxy saw
PROXY_NOTE = "weknora-nb's own request, recorded by a reverse proxy in front of WeKnora Lite"
NOTES = {"faqchat429": "the requests weknora-nb's client.chat sends (a session titled weknora-nb, then the chat with "
                       "disable_title), made through the recording proxy while the embedding endpoint answered 429, "
                       "the stream read for 25 s"}


def go_json(value: Any) -> str:
    """``value`` as Go's ``encoding/json`` writes it: compact, key order kept, non-ASCII as is, ``<`` ``>``
    ``&`` U+2028 U+2029 escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def trim(value: Any, cuts: list[int]) -> Any:
    """``value`` with every ``metadata.content`` longer than :data:`KEEP` cut (their lengths into ``cuts``)."""
    if isinstance(value, list):
        return [trim(v, cuts) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k == "metadata" and isinstance(v, dict) and isinstance(v.get("content"), str) and len(v["content"]) > KEEP:
            cuts.append(len(v["content"]))
            v = {**v, "content": v["content"][:KEEP] + MARKER.format(n=len(v["content"]))}
        out[k] = trim(v, cuts)
    return out


def trim_sse(raw: str, cuts: list[int], copies: list[int]) -> str:
    """The stream with each ``data:`` line trimmed and written back as Go writes it; other bytes unchanged."""
    lines = raw.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("data:"):
            event = json.loads(line[5:])
            if go_json(event) != line[5:]:
                raise SystemExit(f"an SSE line does not come back byte for byte: {line[:120]}")
            lines[i] = "data:" + go_json(trim_copies(trim(event, cuts), copies))
    return "\n".join(lines)


def trim_copies(event: dict[str, Any], copies: list[int]) -> dict[str, Any]:
    """A ``references`` event whose ``data.references`` items each equal the ``knowledge_references`` item of
    the same place (the memory stream manager's: the Redis one's differ, and are kept whole) with each copy's
    ``content`` cut to :data:`KEEP` characters (their lengths into ``copies``)."""
    refs = event.get("knowledge_references")
    data = event.get("data")
    copy = data.get("references") if isinstance(data, dict) else None
    if event.get("response_type") != "references" or not isinstance(refs, list) or copy != refs:
        return event
    cut = []
    for i, item in enumerate(copy):
        text = item.get("content")
        if isinstance(text, str) and len(text) > KEEP:
            copies.append(len(text))
            item = {**item, "content": text[:KEEP] + COPY_MARKER.format(i=i, n=len(text))}
        cut.append(item)
    return {**event, "data": {**data, "references": cut}}


def _query(q: Any) -> list[list[str]] | None:
    if not q:
        return None
    pairs = q.items() if isinstance(q, dict) else q
    return [[str(k), str(v)] for k, v in pairs]


def _auth(headers: dict[str, str]) -> list[str]:
    names = {k.lower() for k in headers}
    return [n for n, h in (("api_key", "x-api-key"), ("bearer", "authorization")) if h in names]


def _headers(resp: dict[str, Any], sse: bool) -> dict[str, str]:
    keep = ("content-type", "x-request-id") + (("cache-control", "x-accel-buffering") if sse else ())
    return {k: v for k, v in resp["headers"].items() if k in keep}


def curate(rec: dict[str, Any], name: str, source: str, out: Path, stream_manager: str) -> tuple[dict, str | None]:
    """One interaction as a fixture (and its SSE text, if any)."""
    req, resp = rec["request"], rec["response"]
    cuts: list[int] = []
    copies: list[int] = []
    body = req.get("body")
    redacted = isinstance(body, dict) and "password" in body
    if redacted:
        body = {**body, "password": "<redacted>"}
    request: dict[str, Any] = {"method": req["method"], "path": req["path"], "query": _query(req.get("query")),
                               "auth": _auth(req.get("headers") or {})}
    if isinstance(body, str):
        request["body_text"] = body
    else:
        request["body"] = body
    sse_text = resp.get("raw_sse")
    if sse_text is None and resp.get("raw_sse_b64"):
        sse_text = base64.b64decode(resp["raw_sse_b64"]).decode("utf-8")
    response: dict[str, Any] = {"status": resp["status"], "headers": _headers(resp, sse_text is not None)}
    if sse_text is not None:
        sse_text = trim_sse(sse_text, cuts, copies)
        response["sse"] = f"{name}.sse"
        response["stays_open"] = bool(resp.get("client_gave_up"))
    else:
        raw = base64.b64decode(resp["raw_b64"]) if resp.get("raw_b64") else None
        parsed = resp.get("body")
        if isinstance(parsed, (dict, list)):
            if raw is not None and go_json(parsed) != raw.decode("utf-8").rstrip("\n"):
                raise SystemExit(f"{source}: the JSON body does not come back byte for byte")
            response["body"] = trim(parsed, cuts)
        else:
            response["body_text"] = parsed if isinstance(parsed, str) else ""
    trimmed = []
    if cuts:
        trimmed.append(f"metadata.content of {len(cuts)} object(s) cut to {KEEP} characters (recorded: "
                       f"{min(cuts)}-{max(cuts)} characters)")
    if copies:
        trimmed.append(f"the content of {len(copies)} data.references item(s) of the references event, each a copy of "
                       f"the knowledge_references item at its place, cut to {KEEP} characters (recorded: "
                       f"{min(copies)}-{max(copies)} characters)")
    if redacted:
        trimmed.append("the request's password replaced by <redacted>")
    fixture = {"weknora": {**WEKNORA, "stream_manager": stream_manager}, "name": name, "note": rec.get("note", ""),
               "source": source, "trimmed": trimmed, "request": request, "response": response}
    other = rec.get("also")
    if other is not None:
        if (other["response"]["status"], other["response"].get("body")) != (resp["status"], resp.get("body")):
            raise SystemExit(f"{source}: the answer given as also_requests differs")
        more, _ = curate({k: v for k, v in other.items() if k != "also"}, name, "", out, stream_manager)
        fixture["also_requests"] = [more["request"]]
        fixture["note"] += "; the same answer was recorded for each of also_requests"
    return fixture, sse_text


def _write(folder: Path, fixture: dict, sse: str | None) -> None:
    """The fixture as indented JSON, its response body on one line (a third smaller, the rest easy to read)."""
    folder.mkdir(parents=True, exist_ok=True)
    response = dict(fixture["response"])
    body = response.pop("body", _NO_BODY)
    if body is not _NO_BODY:
        response["body"] = _BODY_MARK
    text = json.dumps({**fixture, "response": response}, ensure_ascii=False, indent=1)
    if body is not _NO_BODY:
        text = text.replace(json.dumps(_BODY_MARK), json.dumps(body, ensure_ascii=False), 1)
    (folder / f"{fixture['name']}.json").write_text(text + "\n", encoding="utf-8")
    if sse is not None:
        (folder / fixture["response"]["sse"]).write_bytes(sse.encode("utf-8"))


_NO_BODY = object()
_BODY_MARK = "\u0000body\u0000"


def _key(fixture: dict, sse: str | None) -> str:
    """What makes two interactions the same: the request, the status and the body (not the request id)."""
    resp = {k: v for k, v in fixture["response"].items() if k not in ("headers", "sse")}
    return json.dumps([fixture["request"], resp, sse], sort_keys=True, ensure_ascii=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recordings", type=Path)
    ap.add_argument("client_recordings", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/weknora-v0.7.2")
    a = ap.parse_args()
    shutil.rmtree(a.out / "interactions", ignore_errors=True)
    for label in SCENARIOS:   # the recordings only: a scenario's run.json and testset.jsonl are kept
        for old in (a.out / label).glob("[0-9]*.*"):
            old.unlink()
    for name in INTERACTIONS:
        rec = json.loads((a.recordings / f"{name}.json").read_text(encoding="utf-8"))
        manager = rec.get("weknora", {}).get("stream_manager", "memory")
        _write(a.out / "interactions", *curate(rec, name, f"recordings/v0.7.2/{name}.json", a.out, manager))
    by_label: dict[str, list[tuple[int, Path]]] = {}
    for path in a.client_recordings.glob("*.json"):
        m = re.fullmatch(r"(.+)-(\d+)", path.stem)
        if m:
            by_label.setdefault(m.group(1), []).append((int(m.group(2)), path))
    for (label, seq), name in CLIENT_CALLS.items():
        path = dict(by_label[label])[seq]
        rec = json.loads(path.read_text(encoding="utf-8"))
        rec["note"] = NOTES.get(label, PROXY_NOTE)
        _write(a.out / "interactions", *curate(rec, name, f"recordings/v0.7.2-client/{path.name}", a.out, "memory"))
    for label, manager in SCENARIOS.items():
        seen: set[str] = set()
        n = 0
        also = {dst[1]: dict(by_label[src[0]])[src[1]] for src, dst in ALSO.items() if dst[0] == label}
        extras = sorted(by_label.get(SCENARIO_EXTRAS.get(label, ""), []))
        for seq, path in [*sorted(by_label[label]), *extras]:
            rec = json.loads(path.read_text(encoding="utf-8"))
            rec["note"] = PROXY_NOTE
            if seq in also and path.stem.startswith(label + "-"):
                rec["also"] = json.loads(also[seq].read_text(encoding="utf-8"))
            fixture, sse = curate(rec, "tmp", f"recordings/v0.7.2-client/{path.name}", a.out, manager)
            key = _key({**fixture, "name": None}, sse)
            if key in seen:
                continue
            seen.add(key)
            n += 1
            words = [w for w in rec["request"]["path"].split("/")[3:] if not re.fullmatch(r"[0-9a-f-]{36}", w)]
            fixture["name"] = f"{n:03d}-{rec['request']['method'].lower()}-{'-'.join(words)}"
            if sse is not None:
                fixture["response"]["sse"] = f"{fixture['name']}.sse"
            _write(a.out / label, fixture, sse)


if __name__ == "__main__":
    main()
