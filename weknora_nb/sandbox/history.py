"""The sandbox's conversation history: six weeks of generated traffic (the routes that read it are in
:mod:`.session_routes`).

**Generated history** (:func:`plan_history`, seeded, deterministic): the questions of
the data folder's test sets (``testset.jsonl`` for the document knowledge base, ``faq/testset.jsonl``
for the FAQ one) asked by users from Monday 3 November to Sunday 14 December 2025 (server time
+08:00), as a Zipf-like popularity makes them: the test set's ``frequent`` questions first, the
``k``-th most popular of ``n`` asked about ``0.84 n / k`` times (420 / k for the demo's 500), the
rest of the long tail once or not at all.
A popular question is asked as written most of the time, else with a surface change that
normalising undoes (punctuation, full-width letters, case), a typo (a confusable character, a
dropped or swapped one, on questions of 12 characters or more) or a small rewording (请问..., ...呢).
Besides: vague questions (怎么弄, 不行了), off-topic ones (你好, 今天天气怎么样), and questions holding
personal data made up here (mobile numbers, ID card numbers with a valid check character, e-mail
addresses, Luhn-valid bank card numbers; :attr:`HistoryPlan.personal_data` lists every one), plus
ticket numbers of 18 digits that are neither (they must not be masked).

Each question is one turn of a session (one to six turns, minutes apart); the answer follows
seconds later with ``knowledge_references`` to the chunks the test set grades 2 or 3 (as WeKnora's
search results, C22, with ``knowledge_base_id``) or, with none, ``is_fallback``. Sessions are
**API traffic** of the production bot's key (id :data:`BOT_KEY_ID`) and of external users, **web
console** chats of five users, and **legacy** rows with no owner (the first ten days). Who owns
them follows the release (C82): from v0.7.2 ``api_tenant_key:1:7`` / ``api_external_user:1:...`` /
the users' ids / ""; at v0.6.x the API traffic belongs to the tenant's first user, as the key acted
as that user then. A few sessions are pinned, one of them an old API session, so the list's first
rows are not its newest (C81).

:func:`materialise` turns the plan into the sessions one release serves; the server adds them on first use.
"""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from weknora_nb.sandbox.auth import FIRST_USER_ID, TENANT_ID
from weknora_nb.sandbox.chat import Session, go_time_nano
from weknora_nb.sandbox.emulation import WeKnoraRelease

SERVER_TZ = timezone(timedelta(hours=8))
HISTORY_START = datetime(2025, 11, 3, tzinfo=SERVER_TZ)
HISTORY_DAYS = 42
#: the production bot's API key id: its sessions are ``api_tenant_key:1:7`` from v0.7.2 (no key the sandbox accepts)
BOT_KEY_ID = 7
#: the web console's users; the first is the tenant's first user (whom a v0.6.x key acts as)
CONSOLE_USERS = (FIRST_USER_ID, "8d2e4f61-0b3a-4c59-a7e8-2f9d1c6b5a04", "b7c1a9e3-5d24-4f8b-9e06-3a1f7c2d8e59",
                 "e0a4d6b2-9c17-4e3f-8b5a-6d2c0f9e1a37", "1c9f3e7a-4b28-4d06-a5e1-7f3b2d8c6e90")

_VAGUE = ("怎么弄", "不行了", "怎么办", "报错了", "又坏了", "没反应", "帮我看看", "这个怎么搞", "用不了了", "？？",
          "啊啊啊")
_OFF_TOPIC = ("你好", "您好", "在吗", "谢谢", "今天天气怎么样", "你是谁", "讲个笑话", "hello", "晚上吃什么", "哈哈哈")
_PERSONAL = {
    "phone": ("我的手机号是{phone}，收不到验证码怎么办", "验证码发不到 {phone} 这个号码上",
              "手机号{phone}换了，怎么改绑定"),
    "id": ("实名认证提交了身份证{id}一直审核不过", "身份证号 {id} 在系统里查不到我的账号"),
    "email": ("麻烦把网关的接入指南发到 {email}", "我的账号 {email} 登录提示密码错误"),
    "card": ("报销卡号{card}绑定失败怎么办", "银行卡 {card} 提示卡号无效"),
    "mixed": ("手机 {phone}，邮箱 {email}，帮我开通网关权限",),
}
_TICKETS = ("工单号 {ticket} 现在是什么进度", "订单 {ticket} 的发票怎么开")
_CONFUSABLE = dict(zip("的得在再做作帐账登录码置制配装吗是部布后候以已几机",
                       "得的再在作做账帐等陆马制置陪撞嘛事布部候后已以机几", strict=True))
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_FALLBACK = "抱歉，知识库中没有找到与您的问题相关的内容。"
_GREETING_REPLY = "您好，我是 DataGate 文档助手，请问有什么可以帮您？"


# ---------------------------------------------------------------------------------------
# the plan: what was asked, when, in which session (release-independent)
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedTurn:
    """One question and its answer: text, kind (``question``, ``vague``, ``off-topic``, ``personal``,
    ``ticket``), the knowledge base asked and the graded chunks ``(chunk id, grade)`` answering it."""

    request_id: str
    text: str
    kind: str
    kb_id: str
    chunks: tuple[tuple[str, int], ...]
    asked: datetime
    answered: datetime
    mentioned: bool


@dataclass(frozen=True)
class PlannedSession:
    """One session: its id, channel (``api``, ``external``, ``web``, ``legacy``), web user, turns, pin."""

    id: str
    channel: str
    user: str
    turns: tuple[PlannedTurn, ...]
    pinned_at: datetime | None = None


@dataclass
class HistoryPlan:
    """The generated sessions and every piece of personal data put into them (kind -> raw values)."""

    sessions: list[PlannedSession]
    personal_data: dict[str, list[str]] = field(default_factory=dict)

    @property
    def questions(self) -> int:
        """User messages in all."""
        return sum(len(s.turns) for s in self.sessions)


@dataclass(frozen=True)
class _Asking:
    text: str
    kind: str
    kb_id: str
    chunks: tuple[tuple[str, int], ...]


def _read_queries(path: Path, kb_id: str) -> list[tuple[str, tuple[tuple[str, int], ...], bool]]:
    """(query, chunks graded 2-3 best first, tagged frequent) of each record of a test-set JSONL; none if absent."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            graded = sorted(((c, g) for c, g in rec.get("relevant", {}).items() if g >= 2), key=lambda x: -x[1])
            out.append((rec["query"], tuple(graded[:3]), "frequent" in rec.get("tags", [])))
    return out


def _variant(text: str, rng: random.Random) -> str:
    """A spelling of a popular question (see the module docstring): mostly the text itself."""
    roll = rng.random()
    if roll < 0.78:
        return text
    if roll < 0.86:  # a surface change that normalising undoes
        return rng.choice([text.rstrip("？?") + "?", text.rstrip("？?") + "？？", text.rstrip("？?。"), text.lower(),
                           text.translate({c: c + 0xFEE0 for c in range(0x21, 0x7F)}), "  " + text + " "])
    cjk = [i for i, ch in enumerate(text) if "\u4e00" <= ch <= "\u9fff"]
    if roll < 0.94 and len(text) >= 12 and len(cjk) >= 4:  # a typo
        i = rng.choice(cjk[:-1])
        if text[i] in _CONFUSABLE:
            return text[:i] + _CONFUSABLE[text[i]] + text[i + 1:]
        if i + 1 in cjk and rng.random() < 0.5:
            return text[:i] + text[i + 1] + text[i] + text[i + 2:]
        return text[:i] + text[i + 1:]
    if len(text) >= 10:  # a small rewording
        bare = text.rstrip("？?")
        return rng.choice(["请问" + text, bare + "呢？", bare + "啊"])
    return text


def _popular_askings(queries: list[tuple[str, str, tuple[tuple[str, int], ...], bool]],
                     rng: random.Random) -> list[_Asking]:
    """Every asking of the test sets' questions: Zipf-like counts, frequent-tagged questions first."""
    head = [q for q in queries if q[3]]
    tail = [q for q in queries if not q[3]]
    rng.shuffle(head)
    rng.shuffle(tail)
    out = []
    top = 0.84 * len(queries)  # 420 for the demo's 500 questions
    for rank, (text, kb_id, chunks, _) in enumerate(head + tail, start=1):
        count = int(top / rank ** 1.05)
        if count == 0:
            count = 1 if rng.random() < 0.75 else 0
        out += [_Asking(_variant(text, rng) if count > 1 else text, "question", kb_id, chunks) for _ in range(count)]
    return out


def _id_number(rng: random.Random) -> str:
    """An ID card number with a real birth date and its check character (GB 11643-1999)."""
    born = datetime(1960, 1, 1) + timedelta(days=rng.randrange(42 * 365))
    body = rng.choice(["110105", "310104", "440305", "330106", "510107"]) + born.strftime("%Y%m%d") + \
        f"{rng.randrange(1000):03d}"
    return body + "10X98765432"[sum(int(d) * w for d, w in zip(body, _ID_WEIGHTS, strict=True)) % 11]


def _luhn_digit(body: str) -> str:
    """The Luhn check digit that makes ``body + digit`` valid."""
    total = 0
    for i, d in enumerate(reversed(body)):
        n = int(d) * (1 if i % 2 else 2)
        total += n - 9 if n > 9 else n
    return str((10 - total % 10) % 10)


def _personal_value(kind: str, rng: random.Random) -> tuple[str, str]:
    """(raw value as the user typed it, the value itself) of one made-up piece of personal data."""
    if kind == "phone":
        value = "1" + rng.choice("3456789") + "".join(rng.choice("0123456789") for _ in range(9))
        typed = rng.choice([value, value, f"{value[:3]} {value[3:7]} {value[7:]}", f"{value[:3]}-{value[3:7]}-"
                            f"{value[7:]}", value.translate({c: c + 0xFEE0 for c in range(0x30, 0x3A)})])
        return typed, value
    if kind == "id":
        value = _id_number(rng)
        return value, value
    if kind == "email":
        value = (f"{rng.choice(['zhangwei', 'lina', 'wangfang', 'liuyang', 'chenjie'])}{rng.randrange(100)}@"
                 f"{rng.choice(['example.com', 'corp.example.cn', 'mail.example.org'])}")
        return value, value
    body = rng.choice(["6222", "6217", "4367", "6228"]) + "".join(rng.choice("0123456789")
                                                                for _ in range(rng.choice([11, 14])))
    value = body + _luhn_digit(body)
    return (" ".join(value[i:i + 4] for i in range(0, len(value), 4)) if rng.random() < 0.3 else value), value


def _ticket(rng: random.Random) -> str:
    """An 18-digit ticket number that is neither an ID card number nor a Luhn-valid card number."""
    while True:
        value = "2025" + "".join(rng.choice("0123456789") for _ in range(14))
        body = value[:17]
        id_ok = "10X98765432"[sum(int(d) * w for d, w in zip(body, _ID_WEIGHTS, strict=True)) % 11] == value[17]
        if not id_ok and _luhn_digit(value[:-1]) != value[-1]:
            return value


#: how many of each other kind of question come with 2350 popular ones (the demo's); at least the second number
_OTHERS = {"vague": (70, 4), "off-topic": (70, 4), "phone": (16, 2), "id": (10, 2), "email": (12, 2), "card": (10, 2),
           "mixed": (6, 1), "ticket": (8, 2)}


def _other_askings(kb_id: str, rng: random.Random, personal: dict[str, list[str]], popular: int) -> list[_Asking]:
    """Vague, off-topic, personal-data and ticket-number questions, as many as :data:`_OTHERS` says for
    ``popular`` popular ones (``personal`` gets every raw value)."""
    count = {k: max(least, round(demo * popular / 2350)) for k, (demo, least) in _OTHERS.items()}
    out = [_Asking(rng.choice(_VAGUE), "vague", kb_id, ()) for _ in range(count["vague"])]
    out += [_Asking(rng.choice(_OFF_TOPIC), "off-topic", kb_id, ()) for _ in range(count["off-topic"])]
    for kind in ("phone", "id", "email", "card", "mixed"):
        for _ in range(count[kind]):
            values = {}
            for k in (("phone", "email") if kind == "mixed" else (kind,)):
                typed, _value = _personal_value(k, rng)
                personal.setdefault(k, []).append(typed)
                values[k] = typed
            out.append(_Asking(rng.choice(_PERSONAL[kind]).format(**values), "personal", kb_id, ()))
    out += [_Asking(rng.choice(_TICKETS).format(ticket=_ticket(rng)), "ticket", kb_id, ())
            for _ in range(count["ticket"])]
    return out


def _start_time(rng: random.Random, days: int) -> datetime:
    """A session start in the first ``days`` days: weekdays five times likelier, working hours mostly."""
    while True:
        day = rng.randrange(days)
        if (HISTORY_START + timedelta(days=day)).weekday() < 5 or rng.random() < 0.2:
            break
    hour = rng.choice([9, 10, 10, 11, 11, 14, 14, 15, 15, 16, 16, 17, 19, 21])
    return HISTORY_START + timedelta(days=day, hours=hour, seconds=rng.randrange(3600),
                                     microseconds=rng.randrange(1_000_000))


def _sessions(askings: list[_Asking], rng: random.Random) -> list[PlannedSession]:
    """``askings`` (shuffled) poured into sessions of one to six turns, each with its channel and times."""
    rng.shuffle(askings)
    out: list[PlannedSession] = []
    i = 0
    while i < len(askings):
        n = rng.choices([1, 2, 3, 4, 5, 6], weights=[55, 25, 12, 4, 2, 2])[0]
        channel = rng.choices(["api", "external", "web", "legacy"], weights=[52, 13, 28, 7])[0]
        at = _start_time(rng, 10 if channel == "legacy" else HISTORY_DAYS)
        turns = []
        for a in askings[i:i + n]:
            answered = at + timedelta(seconds=rng.uniform(1.5, 12))
            turns.append(PlannedTurn(_token(rng, 12), a.text, a.kind, a.kb_id, a.chunks, at, answered,
                                     rng.random() < (0.4 if channel == "web" else 0.15)))
            at = answered + timedelta(seconds=rng.uniform(20, 300))
        user = rng.choices(CONSOLE_USERS, weights=[30, 20, 20, 15, 15])[0] if channel == "web" else \
            f"emp-{rng.randrange(1, 41):03d}" if channel == "external" else ""
        pinned = turns[-1].answered + timedelta(hours=rng.uniform(1, 48)) if rng.random() < 0.02 else None
        out.append(PlannedSession(str(uuid.UUID(int=rng.getrandbits(128), version=4)), channel, user,
                                  tuple(turns), pinned))
        i += n
    return out


def _token(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(n))


def plan_history(doc_queries: Iterable[tuple[str, tuple[tuple[str, int], ...], bool]], kb_id: str,
                 faq_queries: Iterable[tuple[str, tuple[tuple[str, int], ...], bool]] = (),
                 faq_kb_id: str = "kb-faq", *, seed: int = 20251103) -> HistoryPlan:
    """The generated history of these questions ((text, graded chunks, frequent) each; see the module
    docstring); no question, no history. The oldest API session is pinned, so it tops ``source=api``."""
    queries = [(t, kb_id, c, f) for t, c, f in doc_queries] + [(t, faq_kb_id, c, f) for t, c, f in faq_queries]
    if not queries:
        return HistoryPlan([])
    rng = random.Random(seed)
    personal: dict[str, list[str]] = {}
    popular = _popular_askings(queries, rng)
    sessions = _sessions(popular + _other_askings(kb_id, rng, personal, len(popular)), rng)
    api = [s for s in sessions if s.channel == "api"]
    if api:
        oldest = min(api, key=lambda s: s.turns[0].asked)
        pinned = PlannedSession(oldest.id, oldest.channel, oldest.user, oldest.turns,
                                oldest.turns[-1].answered + timedelta(hours=2))
        sessions = [pinned if s is oldest else s for s in sessions]
    return HistoryPlan(sessions, personal)


_PLANS: dict[tuple[str, str, str], HistoryPlan] = {}
_PLANS_LOCK = threading.Lock()


def demo_plan(data_dir: str | Path, kb_id: str, faq_kb_id: str) -> HistoryPlan:
    """The history of a data folder's test sets (``testset.jsonl``, ``faq/testset.jsonl``), made once per process."""
    d = Path(data_dir).resolve()
    key = (str(d), kb_id, faq_kb_id)
    with _PLANS_LOCK:
        if key not in _PLANS:
            _PLANS[key] = plan_history(_read_queries(d / "testset.jsonl", kb_id), kb_id,
                                       _read_queries(d / "faq" / "testset.jsonl", faq_kb_id), faq_kb_id)
        return _PLANS[key]


# ---------------------------------------------------------------------------------------
# the plan as a release serves it
# ---------------------------------------------------------------------------------------
#: a chunk's search result (C22) with the given score, or None when the server does not serve the chunk
Reference = Callable[[str, float], dict[str, Any] | None]


def _owner(s: PlannedSession, release: WeKnoraRelease) -> str:
    """The session's ``user_id`` in ``release`` (C82)."""
    if s.channel == "legacy":
        return ""
    if s.channel == "web":
        return s.user
    if not release.per_key_sessions:
        return FIRST_USER_ID
    if s.channel == "external":
        return f"api_external_user:{TENANT_ID}:{s.user}"
    return f"api_tenant_key:{TENANT_ID}:{BOT_KEY_ID}"


def _mention(kb_id: str, kb_type: str, release: WeKnoraRelease) -> dict[str, str]:
    """An @-mention of a knowledge base (``types.MentionedItem``; four fields at v0.6.x, eight from v0.7.2)."""
    item = {"id": kb_id, "name": "IT 服务台 FAQ" if kb_type == "faq" else "DataGate 文档", "type": "kb",
            "kb_type": kb_type}
    if release.per_key_sessions:
        item.update(kb_id="", kb_name="", service_id="", skill_name="")
    return item


def _messages(sid: str, channel: str, t: PlannedTurn, refs: list[dict[str, Any]], kb_type: str | None,
              release: WeKnoraRelease) -> list[dict[str, Any]]:
    """The user message and the answer of one turn, as ``types.Message`` marshals them (C85)."""
    rng = random.Random(t.request_id)
    wire = "web" if channel == "web" else "api" if channel in ("api", "external") else ""
    base = {"session_id": sid, "request_id": t.request_id}
    asked, answered = go_time_nano(t.asked), go_time_nano(t.answered)
    user: dict[str, Any] = {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), **base, "content": t.text,
                            "role": "user", "knowledge_references": []}
    if t.mentioned and kb_type is not None:
        user["mentioned_items"] = [_mention(t.kb_id, kb_type, release)]
    user["is_completed"] = True
    if refs:
        first = refs[0]
        sentence = first["content"].split("\n")[-1].split("。")[0][:120]
        text = f"根据《{first['knowledge_title']}》：{sentence}。"
    else:
        text = _GREETING_REPLY if t.kind == "off-topic" else _FALLBACK
    answer: dict[str, Any] = {"id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), **base, "content": text,
                              "role": "assistant", "knowledge_references": refs, "is_completed": True}
    if not refs:
        answer["is_fallback"] = True
    for m, at in ((user, asked), (answer, answered)):
        if wire:
            m["channel"] = wire
        m.update(created_at=at, updated_at=at, deleted_at=None)
    return [user, answer]


def materialise(plan: HistoryPlan, release: WeKnoraRelease, reference: Reference,
                kbs: Mapping[str, str]) -> list[Session]:
    """The plan's sessions as ``release`` serves them: owners, message JSON, references to the chunks the
    server has (``reference``), ``last_request_state`` of the last turn; ``kbs``: the knowledge bases
    served (id -> ``document`` / ``faq``), which the bot sends with every question and a user mentions."""
    served = list(kbs)
    cache: dict[tuple[str, int], dict[str, Any] | None] = {}

    def refs_of(t: PlannedTurn) -> list[dict[str, Any]]:
        out = []
        for n, (chunk, grade) in enumerate(t.chunks):
            if (chunk, n) not in cache:
                cache[chunk, n] = reference(chunk, round((0.9 if grade == 3 else 0.7) - 0.05 * n, 4))
            ref = cache[chunk, n]
            if ref is not None:
                out.append(ref)
        return out
    sessions = []
    for p in plan.sessions:
        messages = [m for t in p.turns for m in _messages(p.id, p.channel, t, refs_of(t), kbs.get(t.kb_id), release)]
        last = p.turns[-1]
        state = {"agent_enabled": False, "knowledge_base_ids": [last.kb_id] if p.channel == "web" else served,
                 "web_search_enabled": False}
        title = p.turns[0].text.strip()[:16]
        sessions.append(Session(p.id, title, "", TENANT_ID, p.turns[0].asked, messages, user_id=_owner(p, release),
                                updated=p.pinned_at or last.answered, pinned_at=p.pinned_at,
                                last_request_state=state))
    return sessions
