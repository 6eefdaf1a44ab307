"""Conversation history: the sandbox serves it as WeKnora does (C81-C88), and ``testset sample`` reads it.

Over real HTTP on loopback: a :class:`SandboxServer` of a small data folder (the mini knowledge base,
an FAQ knowledge base and two small test sets, so a generated history of a few hundred questions),
per release; the client (:mod:`weknora_nb.collect.history`) and the command line against it. The
server's own state is read in-process only to know what the right answer is.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from weknora_nb import cli
from weknora_nb.analysis.privacy import id_card_ok, luhn_ok
from weknora_nb.collect.history import fetch_history, parse_time
from weknora_nb.collect.http.client import ClientSettings
from weknora_nb.collect.http.transport import default_tls
from weknora_nb.core.weknora import ERROR_CODES
from weknora_nb.sandbox import SandboxServer
from weknora_nb.sandbox.auth import FIRST_USER_ID
from weknora_nb.sandbox.emulation import DEFAULT_RELEASE, RELEASES
from weknora_nb.sandbox.history import BOT_KEY_ID, demo_plan, plan_history
from weknora_nb.sandbox.runner import demo_dir

FIXTURES = Path(__file__).parent / "fixtures"
KEY = "sk-history-full-0123456789abcdef"
CHAT = "sk-history-chat"
RETRIEVE = "sk-history-retrieve"
API_KEYS: dict[str, dict[str, Any]] = {CHAT: {"capabilities": ["chat"]}, RETRIEVE: {"capabilities": ["retrieve"]}}
V06, V07 = ("v0.6.2", "v0.6.3"), ("v0.7.2", "main")
KB, FAQ = "kb-demo", "kb-faq"
RFC3339NANO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d*[1-9])?(Z|[+-]\d{2}:\d{2})$")
NOT_ADMIN = "error code: 1002, error message: listing channel sessions requires tenant admin or owner role"

#: (question, graded chunks, tagged frequent): the mini knowledge base's chunks
DOC_QUERIES = [
    ("管理员忘记密码了，应该执行什么命令重置？", {"guide.01-passwords:000": 3}, True),
    ("连续输错密码几次会被锁定，锁多久？", {"guide.01-passwords:001": 3}, True),
    ("控制台提示 DG-1010 是什么原因？", {"guide.01-passwords:001": 3}, True),
    ("密码最少要多少个字符，需要几类字符？", {"guide.01-passwords:002": 3}, True),
    ("管理 API 默认每分钟允许多少次请求？", {"guide.02-rate-limit:000": 3}, True),
    ("返回 HTTP 429 和 DG-1009 是被限流了吗？", {"guide.02-rate-limit:000": 3}, False),
    ("怎么在路由上配置 rate-limiting 插件？", {"guide.02-rate-limit:001": 3}, True),
    ("rate-limiting 插件的 policy 可以用 redis 吗？", {"guide.02-rate-limit:001": 2}, False),
    ("网关返回 DG-3007 说明什么？", {"guide.02-rate-limit:002": 3}, True),
    ("熔断器打开以后多长时间进入半开状态？", {"guide.02-rate-limit:002": 3}, False),
    ("ZeroLink 客户端在哪里下载？", {"guide.03-vpn:000": 3}, True),
    ("第一次登录 ZeroLink 需要绑定什么？", {"guide.03-vpn:000": 2}, False),
    ("VPN 连接失败提示 ZL-201 应该怎么处理？", {"guide.03-vpn:001": 3}, True),
    ("手机令牌时间不同步会导致什么问题？", {"guide.03-vpn:001": 2}, False),
    ("服务台的分机号码是多少？", {"guide.03-vpn:001": 2}, False),
    ("新密码多长时间之内必须修改？", {"guide.01-passwords:000": 2}, False),
    ("超级管理员怎么给被锁定的账号解锁？", {"guide.01-passwords:001": 3}, False),
    ("历史密码有什么限制？", {"guide.01-passwords:002": 2}, False),
    ("限流以后响应头里会带什么？", {"guide.02-rate-limit:000": 2}, False),
    ("每分钟 1200 次的限流怎么写配置？", {"guide.02-rate-limit:001": 3}, False),
]
FAQ_QUERIES = [
    ("管理员密码忘了咋办", {"faq-001": 3}, True),
    ("账号锁了要等多久才能再登录", {"faq-002": 3}, True),
    ("密码复杂度规则是什么", {"faq-003": 3}, False),
    ("管理接口一分钟能调多少次", {"faq-004": 3}, False),
    ("ZL-201 连不上 VPN", {"faq-006": 3}, False),
]


def _write_testset(path: Path, queries: list[tuple[str, dict[str, int], bool]], prefix: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"query_id": f"{prefix}{i:03d}", "query": q, "relevant": rel,
                                        "tags": ["frequent" if f else "long-tail"]}, ensure_ascii=False) + "\n"
                            for i, (q, rel, f) in enumerate(queries, start=1)), encoding="utf-8")


@pytest.fixture(scope="module")
def history_kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini knowledge base plus an FAQ knowledge base (version ``faq``) and a test set for each."""
    d = tmp_path_factory.mktemp("history_kb")
    shutil.copytree(FIXTURES / "mini_kb" / "docs", d / "docs")
    shutil.copytree(FIXTURES / "mini_kb" / "cache", d / "cache")  # its embedding seed (tests/test_fixture_seeds.py)
    (d / "faq").mkdir()
    shutil.copy(FIXTURES / "faq_small.jsonl", d / "faq" / "faq.jsonl")
    (d / "versions.yaml").write_text("defaults:\n  hnsw: {m: 8, ef_construction: 50, ef_search: 16}\n"
                                     "versions:\n  faq:\n    faq: {enabled: true}\n", encoding="utf-8")
    _write_testset(d / "testset.jsonl", DOC_QUERIES, "d")
    _write_testset(d / "faq" / "testset.jsonl", FAQ_QUERIES, "f")
    return d


@pytest.fixture(scope="module")
def servers(history_kb: Path, embedding_cache: Path) -> Iterator[Callable[..., SandboxServer]]:
    """``servers(release)``: a started server of :func:`history_kb` (one per release, kept for the module)."""
    cache = embedding_cache
    started: dict[str, SandboxServer] = {}

    def get(release: str = DEFAULT_RELEASE) -> SandboxServer:
        if release not in started:
            started[release] = SandboxServer("faq", data_dir=history_kb, cache_dir=cache, api_key=KEY,
                                             api_keys=API_KEYS, allow_fault_control=True,
                                             weknora_version=release).start()
        sb = started[release]
        sb.set_faults()
        return sb
    yield get
    for sb in started.values():
        sb.stop()


def call(sb: SandboxServer, method: str, path: str, *, key: str = KEY, **kw: Any) -> httpx.Response:
    return httpx.request(method, sb.base_url + path, headers={"X-API-Key": key}, timeout=30,
                         verify=default_tls(), **kw)


def envelope_error(r: httpx.Response, code: int) -> dict[str, Any]:
    assert r.status_code == ERROR_CODES[code][1], r.text
    body = r.json()
    assert body["success"] is False and body["error"]["code"] == code, body
    return body["error"]


def every_session(sb: SandboxServer, *, key: str = KEY, page_size: int = 7, **params: Any) -> list[dict[str, Any]]:
    """All rows of a listing, page by page until ``total``."""
    rows: list[dict[str, Any]] = []
    page = 1
    while True:
        body = call(sb, "GET", "/api/v1/sessions", key=key, params={"page": page, "page_size": page_size, **params})
        body = body.json()
        assert body["page"] == page and body["page_size"] == page_size
        rows += body["data"]
        if not body["data"] or len(rows) >= body["total"]:
            assert len(rows) == body["total"]
            return rows
        page += 1


def state(sb: SandboxServer) -> dict[str, Any]:
    """The server's sessions (the history made first): what the right answers are."""
    sb.sandbox.conversations.load_history()
    return sb.sandbox.conversations.sessions


def readable_ids(sb: SandboxServer, release: str) -> set[str]:
    """The sessions the full-access key may read (C84): legacy and the first user's at v0.6.x; legacy, its
    own and every API-owned one from v0.7.2."""
    if release in V06:
        return {sid for sid, s in state(sb).items() if s.user_id in ("", FIRST_USER_ID)}
    return {sid for sid, s in state(sb).items() if s.user_id == "" or s.user_id.startswith("api_")}


def when(text: str) -> datetime:
    t = parse_time(text)
    assert t is not None, text
    return t


# ---------------------------------------------------------------------------------------
# the generated history
# ---------------------------------------------------------------------------------------
def test_the_demo_history_is_zipf_like_deterministic_and_holds_real_looking_personal_data():
    plan = demo_plan(demo_dir(), KB, FAQ)
    again = plan_history([], KB)
    assert again.sessions == []  # no question, no history
    asked: dict[str, int] = {}
    for s in plan.sessions:
        for t in s.turns:
            asked[t.text] = asked.get(t.text, 0) + 1
    counts = sorted(asked.values(), reverse=True)
    assert 2 * plan.questions >= 4000  # several thousand messages (a question and its answer each)
    assert counts[0] >= 200 and counts[2] >= 100  # a few asked hundreds of times
    assert sum(c == 1 for c in counts) >= len(counts) / 3  # a long tail asked once
    days = {t.asked.date() for s in plan.sessions for t in s.turns}
    assert (max(days) - min(days)).days >= 35  # over weeks
    assert {s.channel for s in plan.sessions} == {"api", "external", "web", "legacy"}
    assert {t.kind for s in plan.sessions for t in s.turns} == {"question", "vague", "off-topic", "personal", "ticket"}
    assert all(id_card_ok(v) for v in plan.personal_data["id"])
    assert all(luhn_ok(v.replace(" ", "")) for v in plan.personal_data["card"])
    assert all(re.fullmatch(r"1[3-9]\d{9}", re.sub(r"[ -]", "", v.translate(
        {c: c - 0xFEE0 for c in range(0xFF10, 0xFF1A)}))) for v in plan.personal_data["phone"])
    same = plan_history([("q", (), True)], KB, seed=5)
    assert same == plan_history([("q", (), True)], KB, seed=5)  # seeded
    assert demo_plan(demo_dir(), KB, FAQ) is plan  # made once per process


# ---------------------------------------------------------------------------------------
# C81-C88: the sandbox serves sessions and messages as WeKnora does
# ---------------------------------------------------------------------------------------
@pytest.mark.contract("C81")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_the_session_list_pages_pinned_first_then_newest_and_refuses_over_1000(servers, release):
    sb = servers(release)
    source = {"source": "api"} if release in V07 else {}  # where the pinned API sessions are listed
    for bad in ("1001", "-1", "x"):
        envelope_error(call(sb, "GET", "/api/v1/sessions", params={"page_size": bad, **source}), 1000)
    first = call(sb, "GET", "/api/v1/sessions", params=source).json()
    assert (first["page"], first["page_size"], len(first["data"])) == (1, 20, 20)
    rows = every_session(sb, **source)
    assert len({r["id"] for r in rows}) == len(rows) == first["total"]
    pinned = [r for r in rows if r["is_pinned"]]
    assert pinned and rows[:len(pinned)] == pinned and all("pinned_at" in r for r in pinned)
    assert [r["pinned_at"] for r in pinned] == sorted((r["pinned_at"] for r in pinned), key=when, reverse=True)
    rest = [when(r["updated_at"]) for r in rows[len(pinned):]]
    assert rest == sorted(rest, reverse=True)
    assert when(pinned[-1]["updated_at"]) < rest[0]  # a pinned row tops the list, however old
    title = rows[5]["title"]
    found = every_session(sb, keyword=title[2:6].upper(), **source)
    assert rows[5]["id"] in {r["id"] for r in found} and all(title[2:6].lower() in r["title"].lower() for r in found)


@pytest.mark.contract("C82")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_a_key_lists_its_own_sessions_and_legacy_ones(servers, release):
    sb = servers(release)
    mine = call(sb, "POST", "/api/v1/sessions", json={"title": "mine"}).json()["data"]
    theirs = call(sb, "POST", "/api/v1/sessions", key=CHAT, json={"title": "theirs"}).json()["data"]
    listed = {r["id"]: r for r in every_session(sb, page_size=100)}
    sessions = state(sb)
    if release in V07:
        assert mine["user_id"] == "api_tenant_key:1:1" and theirs["user_id"] == "api_tenant_key:1:2"
        expected = {sid for sid, s in sessions.items() if s.user_id in ("", mine["user_id"])}
        assert mine["id"] in listed and theirs["id"] not in listed
        assert theirs["id"] in {r["id"] for r in every_session(sb, key=CHAT, page_size=100)}
    else:  # the key is the tenant's first user, whoever calls with it
        assert mine["user_id"] == theirs["user_id"] == FIRST_USER_ID
        expected = {sid for sid, s in sessions.items() if s.user_id in ("", FIRST_USER_ID)}
        assert {mine["id"], theirs["id"]} <= set(listed)
    assert set(listed) == expected and any(r.get("user_id", "") == "" for r in listed.values())  # legacy rows
    assert any(s.user_id not in ("", mine["user_id"]) for s in sessions.values())  # others': not listed


@pytest.mark.contract("C83")
@pytest.mark.parametrize("release", ["v0.6.3", "v0.7.2", "main"])
def test_the_api_source_is_a_tenant_wide_view_for_admins_only(servers, release):
    sb = servers(release)
    if release in V06:
        assert call(sb, "GET", "/api/v1/sessions", params={"source": "api"}).json()["total"] == 0
        return
    assert envelope_error(call(sb, "GET", "/api/v1/sessions", key=CHAT, params={"source": "api"}),
                          1007)["message"] == NOT_ADMIN
    api = every_session(sb, source="api", page_size=50)
    expected = {sid for sid, s in state(sb).items() if s.user_id.startswith(("api_tenant_key:", "api_external_user:"))}
    assert {r["id"] for r in api} == expected
    assert f"api_tenant_key:1:{BOT_KEY_ID}" in {r["user_id"] for r in api}  # the production bot's traffic
    assert any(r["user_id"].startswith("api_external_user:1:") for r in api)
    web = every_session(sb, source="web", page_size=50)  # not a channel view: the key's own scope, no API rows
    assert web and all(r.get("user_id", "") == "" for r in web)


@pytest.mark.contract("C84")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_reading_a_session_follows_the_owner_scope_and_the_admin_fallback(servers, release):
    sb = servers(release)
    sessions = [s for s in state(sb).values() if s.messages]
    bot = next(s for s in sessions if s.messages[0].get("channel") == "api" and not s.user_id.startswith("api_ext"))
    first_users_web = next(s for s in sessions if s.user_id == FIRST_USER_ID and s.messages[0].get("channel") == "web")
    other_users_web = next(s for s in sessions if s.user_id not in ("", FIRST_USER_ID) and
                           s.messages[0].get("channel") == "web")
    legacy = next(s for s in sessions if s.user_id == "")

    def readable(s: Any, key: str = KEY) -> bool:
        got = call(sb, "GET", f"/api/v1/sessions/{s.id}", key=key)
        loaded = call(sb, "GET", f"/api/v1/messages/{s.id}/load", key=key)
        assert got.status_code == loaded.status_code
        if got.status_code == 404:
            assert envelope_error(got, 1003)["message"] == envelope_error(loaded, 1003)["message"] == \
                "session not found"
            return False
        assert got.json()["data"]["id"] == s.id and loaded.json()["data"]
        return True
    assert readable(legacy) and readable(legacy, CHAT)
    assert not readable(other_users_web) and not readable(other_users_web, CHAT)
    if release in V07:
        assert readable(bot) and not readable(bot, CHAT)  # the admin fallback: full access only
        assert not readable(first_users_web)  # a console user's chat: no API key reads it
    else:
        assert readable(bot) and readable(first_users_web)  # the key acts as the first user


@pytest.mark.contract("C85")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_messages_are_typed_like_weknoras_with_references_to_knowledge_bases(servers, release):
    sb = servers(release)
    mentioned = next(s for s in state(sb).values() if s.id in readable_ids(sb, release) and
                     any(m.get("mentioned_items") for m in s.messages) and
                     any(m["knowledge_references"] for m in s.messages))
    msgs = call(sb, "GET", f"/api/v1/messages/{mentioned.id}/load", params={"limit": 100}).json()["data"]
    user = next(m for m in msgs if m.get("mentioned_items"))
    answer = next(m for m in msgs if m["role"] == "assistant" and m["request_id"] == user["request_id"])
    assert set(user) == {"id", "session_id", "request_id", "content", "role", "knowledge_references",
                         "mentioned_items", "is_completed", "channel", "created_at", "updated_at", "deleted_at"}
    assert user["role"] == "user" and user["knowledge_references"] == [] and user["deleted_at"] is None
    item_fields = {"id", "name", "type", "kb_type"} | ({"kb_id", "kb_name", "service_id", "skill_name"}
                                                       if release in V07 else set())
    assert set(user["mentioned_items"][0]) == item_fields and user["mentioned_items"][0]["type"] == "kb"
    assert set(answer) >= {"id", "session_id", "request_id", "content", "role", "knowledge_references",
                           "is_completed", "created_at", "updated_at", "deleted_at"}
    refs = [r for m in msgs for r in m["knowledge_references"]]
    assert refs and all(r["knowledge_base_id"] in (KB, FAQ) and r["id"] for r in refs)
    fallback = next(m for s in state(sb).values() for m in s.messages if m["role"] == "assistant"
                    and not m["knowledge_references"])
    assert fallback["is_fallback"] is True
    for m in msgs:
        assert RFC3339NANO.match(m["created_at"]) and m["created_at"].endswith("+08:00"), m["created_at"]


@pytest.mark.contract("C86", "C67")
@pytest.mark.parametrize("release", ["v0.6.2", "main"])
def test_messages_load_newest_first_pages_and_go_back_strictly_before(servers, release):
    sb = servers(release)
    long = max((s for s in state(sb).values() if s.id in readable_ids(sb, release)), key=lambda s: len(s.messages))
    path = f"/api/v1/messages/{long.id}/load"
    everything = call(sb, "GET", path, params={"limit": 1000}).json()["data"]
    assert [m["id"] for m in everything] == [m["id"] for m in long.messages] and len(everything) >= 4
    got: list[dict[str, Any]] = []
    before = None
    while True:
        page = call(sb, "GET", path, params={"limit": 3, **({"before_time": before} if before else {})}).json()["data"]
        times = [when(m["created_at"]) for m in page]
        assert times == sorted(times)  # each page oldest first
        got = page + got
        if len(page) < 3:
            break
        before = page[0]["created_at"]  # sent back as written (httpx encodes the "+" of the offset)
    assert [m["id"] for m in got] == [m["id"] for m in everything]
    cut = everything[2]["created_at"]
    assert [m["id"] for m in call(sb, "GET", path, params={"before_time": cut}).json()["data"]] == \
        [m["id"] for m in everything[:2]]  # strictly before
    assert len(call(sb, "GET", path, params={"limit": "x"}).json()["data"]) == min(20, len(everything))
    for bad in ("2025-12-01", cut.replace("+", " ")):  # a date alone; a "+" sent unencoded (a space)
        assert envelope_error(call(sb, "GET", path, params={"before_time": bad}), 1000)["message"] == \
            "Invalid time format, please use RFC3339 or RFC3339Nano format"


@pytest.mark.contract("C87")
@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_a_chat_request_moves_updated_at_and_keeps_the_last_request_state(servers, release):
    sb = servers(release)
    s = call(sb, "POST", "/api/v1/sessions", json={"title": "state"}).json()["data"]
    assert "knowledge_base_id" not in s and "last_request_state" not in s and s["is_pinned"] is False
    assert "pinned_at" not in s
    body = {"query": "VPN 连接失败 ZL-201", "knowledge_base_ids": [KB], "disable_title": True,
            "mentioned_items": [{"id": KB, "name": "kb", "type": "kb"}]}
    assert call(sb, "POST", f"/api/v1/knowledge-chat/{s['id']}", json=body).status_code == 200
    after = call(sb, "GET", f"/api/v1/sessions/{s['id']}").json()["data"]
    question = call(sb, "GET", f"/api/v1/messages/{s['id']}/load").json()["data"][0]
    assert when(after["updated_at"]) >= when(question["created_at"]) > when(s["updated_at"])
    want = {"agent_enabled": False, "knowledge_base_ids": [KB], "web_search_enabled": False}
    if release in V07:
        want["mentioned_items"] = body["mentioned_items"]
    assert after["last_request_state"] == want


@pytest.mark.contract("C88")
@pytest.mark.parametrize("release", ["v0.7.2", "main"])
def test_message_search_is_tenant_wide_before_main_and_owner_scoped_at_main(servers, release):
    sb = servers(release)
    r = call(sb, "POST", "/api/v1/messages/search", json={"query": "密码", "limit": 1000})
    owners = {state(sb)[i["session_id"]].user_id for i in r.json()["data"]["items"]}
    if release == "main":
        assert owners and owners <= {"", "api_tenant_key:1:1"}
    else:
        assert f"api_tenant_key:1:{BOT_KEY_ID}" in owners and any(o not in ("", FIRST_USER_ID) and not
                                                                  o.startswith("api_") for o in owners)


# ---------------------------------------------------------------------------------------
# the client: every visible question, paged, filtered, failures counted
# ---------------------------------------------------------------------------------------
def settings(sb: SandboxServer, monkeypatch: pytest.MonkeyPatch, key: str = KEY, **kw: Any) -> ClientSettings:
    monkeypatch.setenv("WEKNORA_API_KEY", key)
    return ClientSettings(base_url=sb.base_url, **kw)


def visible_sessions(sb: SandboxServer, owner: str, *, api: bool) -> list[Any]:
    """The sessions a key of ``owner`` lists (with ``source=api`` too when ``api``)."""
    return [s for s in state(sb).values() if s.user_id in ("", owner) or
            (api and s.user_id.startswith(("api_tenant_key:", "api_external_user:")))]


def visible_questions(sb: SandboxServer, owner: str, *, api: bool) -> list[tuple[str, str]]:
    """(session id, created_at) of every user message of :func:`visible_sessions`."""
    return sorted((s.id, m["created_at"]) for s in visible_sessions(sb, owner, api=api) for m in s.messages
                  if m["role"] == "user")


@pytest.mark.parametrize("release", ["v0.6.2", "v0.7.2"])
def test_the_crawl_reads_every_question_the_key_may_see_across_pages(servers, monkeypatch, release):
    sb = servers(release)
    crawl = fetch_history(settings(sb, monkeypatch), page_size=7, limit=3)
    owner = "api_tenant_key:1:1" if release in V07 else FIRST_USER_ID
    assert sorted((q.session_id, q.created_at) for q in crawl.queries) == visible_questions(sb, owner,
                                                                                              api=release in V07)
    assert crawl.complete and crawl.sessions_read == len(visible_sessions(sb, owner, api=release in V07))
    assert crawl.messages_seen == 2 * len(crawl.queries)  # each question and its answer
    chat_only = fetch_history(settings(sb, monkeypatch, CHAT), page_size=50)
    if release in V07:  # no source=api for a scoped key: noted, not a failure
        assert chat_only.complete and any("source=api refused" in n for n in chat_only.notes)
        assert len(chat_only.queries) < len(crawl.queries)


def test_since_keeps_later_questions_and_stops_listing_at_old_unpinned_rows(servers, monkeypatch):
    sb = servers()
    since = datetime(2025, 12, 1, tzinfo=UTC)
    crawl = fetch_history(settings(sb, monkeypatch), since=since, page_size=10, limit=2)
    everything = visible_questions(sb, "api_tenant_key:1:1", api=True)
    later = [x for x in everything if when(x[1]) >= since]
    assert sorted((q.session_id, q.created_at) for q in crawl.queries) == later
    assert crawl.sessions_older > 0 and crawl.before_since >= 0
    assert crawl.sessions_read < len({sid for sid, _ in everything})  # old sessions were not loaded
    old_pinned = [s for s in state(sb).values() if s.pinned_at and s.last_change < since - timedelta(days=1)]
    assert old_pinned  # listed near the top, yet the listing went on past it


def test_kb_id_keeps_the_questions_whose_evidence_names_the_knowledge_base(servers, monkeypatch):
    sb = servers()
    everything = fetch_history(settings(sb, monkeypatch))
    faq = fetch_history(settings(sb, monkeypatch), kb_id=FAQ)
    assert faq.queries and all(FAQ in q.kb_ids for q in faq.queries)
    by_refs = {(q.session_id, q.request_id) for q in everything.queries if q.evidence == "references"
               and FAQ in q.kb_ids}
    assert by_refs <= {(q.session_id, q.request_id) for q in faq.queries}
    assert not any(q.kb_ids == (KB,) for q in faq.queries)  # a question answered from the documents: out
    assert sum(faq.other_kb.values()) + len(faq.queries) == len(everything.queries)
    assert {q.evidence for q in everything.queries} >= {"references", "session"}


def test_a_server_fault_mid_crawl_counts_sessions_as_failed_never_drops_them(servers, monkeypatch):
    sb = servers()
    sb.set_faults(error_rate=0.2, seed=3)
    crawl = fetch_history(settings(sb, monkeypatch, max_attempts=1), page_size=10)
    sb.set_faults()
    summary = crawl.summary()
    visible = len(visible_sessions(sb, "api_tenant_key:1:1", api=True))
    assert summary["sessions_failed"] > 0 and summary["sessions_failed_by_kind"] == {"server": summary[
        "sessions_failed"]} and len(summary["sessions_failed_ids"]) == summary["sessions_failed"]
    read_or_failed = summary["sessions_read"] + summary["sessions_failed"]  # each listed session, once
    assert read_or_failed <= visible <= read_or_failed + summary["sessions_on_failed_pages"]
    assert not crawl.complete


# ---------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------
def test_sample_writes_a_loadable_masked_test_set_and_its_summary(servers, monkeypatch, tmp_path, capsys, caplog):
    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    out = tmp_path / "candidates.jsonl"
    caplog.set_level("DEBUG")
    assert cli.main(["-vv", "testset", "sample", "--base-url", sb.base_url, "--n", "20", "--seed", "1",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr()
    summary = json.loads((tmp_path / "candidates.jsonl.summary.json").read_text(encoding="utf-8"))
    assert json.loads(printed.out[:printed.out.rindex("}") + 1]) == summary
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == summary["sampled"] == 20
    assert set(records[0]) == {"query_id", "query", "relevant", "query_type", "tags", "weight", "source",
                               "n_sessions", "first_seen", "last_seen"}
    assert {r["source"] for r in records} == {"traffic"}
    assert all(r["relevant"] == {} and r["weight"] >= r["n_sessions"] >= 1 for r in records)
    assert summary["user_queries"] == summary["user_messages"] and summary["sessions_failed"] == 0
    assert summary["unique_exact"] >= summary["clusters"] and sum(summary["sampled_by_stratum"].values()) == 20
    assert sum(summary["masked"].values()) > 0
    # nothing unmasked anywhere: the files, what was printed, what was logged
    plan = demo_plan(sb.data_dir, KB, FAQ)
    text = out.read_text(encoding="utf-8") + json.dumps(summary, ensure_ascii=False) + printed.out + printed.err + \
        caplog.text
    for values in plan.personal_data.values():
        for v in values:
            assert v not in text and v.replace(" ", "").replace("-", "") not in text


def test_sample_output_loads_as_a_test_set(servers, monkeypatch, tmp_path):
    from weknora_nb.core.testset import load_testset

    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    out = tmp_path / "c.jsonl"
    assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--n", "25", "--out", str(out)]) == 0
    ts = load_testset(out)
    ids = [json.loads(line)["query_id"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert ts.queries["query_id"].tolist() == ids and ts.n_valid == 0  # nobody judged them yet


def test_the_loader_keeps_the_traffic_weight(servers, monkeypatch, tmp_path):
    from weknora_nb.core.testset import load_testset

    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    out = tmp_path / "c.jsonl"
    assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--n", "25", "--out", str(out)]) == 0
    weights = {r["query_id"]: r["weight"] for r in map(json.loads, out.read_text(encoding="utf-8").splitlines())}
    ts = load_testset(out)
    assert ts.queries.set_index("query_id")["weight"].to_dict() == weights


def test_a_key_that_may_not_read_history_is_one_line_and_exit_2(servers, monkeypatch, tmp_path, capsys):
    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", RETRIEVE)
    out = tmp_path / "c.jsonl"
    assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: cannot read the conversation history") and "'chat'" in err
    assert not out.exists()


def test_sample_exits_1_and_counts_what_it_could_not_read(servers, monkeypatch, tmp_path, capsys):
    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    sb.set_faults(error_rate=0.2, seed=3)
    out = tmp_path / "c.jsonl"
    try:
        code = cli.main(["testset", "sample", "--base-url", sb.base_url, "--max-attempts", "1", "--n", "10",
                         "--out", str(out)])
    finally:
        sb.set_faults()
    assert code == 1
    summary = json.loads((tmp_path / "c.jsonl.summary.json").read_text(encoding="utf-8"))
    assert summary["sessions_failed"] > 0 and "could not be read" in capsys.readouterr().out


@pytest.mark.parametrize("release", list(RELEASES))
def test_sample_runs_against_every_release(servers, monkeypatch, tmp_path, release):
    sb = servers(release)
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    out = tmp_path / "c.jsonl"
    assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--n", "10", "--kb-id", KB,
                     "--out", str(out)]) == 0
    summary = json.loads((tmp_path / "c.jsonl.summary.json").read_text(encoding="utf-8"))
    assert summary["sampled"] == 10 and summary["user_queries"] > 0


def test_filters_that_leave_no_question_say_so_and_write_nothing(servers, monkeypatch, tmp_path, capsys):
    sb = servers()
    monkeypatch.setenv("WEKNORA_API_KEY", KEY)
    out = tmp_path / "c.jsonl"
    assert cli.main(["testset", "sample", "--base-url", sb.base_url, "--kb-id", "kb-nowhere", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no question to sample" in err and "not naming --kb-id" in err
    assert not out.exists() and not (tmp_path / "c.jsonl.summary.json").exists()
