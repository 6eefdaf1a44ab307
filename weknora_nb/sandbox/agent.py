"""The chat's agent and the intent of its query (docs/weknora-contract.md C113, C114).

- **The agent** (C113, extending C66): a knowledge-chat with ``agent_id`` naming an agent runs that agent's
  retrieval settings over config.yaml's ``conversation.*`` (session_qa_helpers.go:199-219 @ v0.7.2); WeKnora's web
  UI sends ``agent_id=builtin-quick-answer`` with every normal-mode chat (views/chat/index.vue:812-838). The
  built-in quick-answer agent (config/builtin_agents.yaml:25-47, the same at all four tags): ``embedding_top_k``
  10, ``vector_threshold`` 0.5, ``keyword_threshold`` 0.3, ``rerank_top_k`` 10, ``rerank_threshold`` 0.3, query
  expansion and rewriting on, FAQ priority on (a reranked FAQ result's score times 1.2, at most 1: C119; its
  direct-answer threshold 0.9 shapes only the model's prompt, which the sandbox has not). Only an agent sets a
  rerank model: in the sandbox the built-in agent's rerank model
  is the version's registered one (``rerank.enabled``), as after a user picks it in the agent editor, and its
  chat model is set (a fresh WeKnora's built-in agent has none, and every chat with it fails until one is
  chosen). An ``agent_id`` that names no agent runs as no agent (a warning in WeKnora's log: qa.go:471-522).
- **The intent** (C114): before searching, WeKnora's query-understanding step asks the chat model to rewrite the
  query and classify its intent; ``greeting``, ``chitchat``, ``follow_up`` and the other intents that need no
  knowledge base skip retrieval: no search, no ``references`` event (query_understand.go:145-152,
  search_parallel.go:93-99, types/chat_manage.go:98-158 @ v0.7.2). The sandbox has no language model: its
  :func:`classify_intent` is a **deterministic rule-based classifier**, not a model. A query that is, once
  trimmed of punctuation, spaces and case, one of a short list of greetings (你好, hello, 早上好, ...) is a
  ``greeting``, one of a short list of small talk (你是谁, 谢谢, 再见, ...) ``chitchat``; everything else is
  ``kb_search``. It never rewrites the query, and it cannot tell a follow-up (that needs the conversation).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from weknora_nb.sandbox.engine import RetrievalEngine
from weknora_nb.sandbox.pipeline import CONVERSATION_SETTINGS, PipelineSettings, expansion_variants

if TYPE_CHECKING:
    from weknora_nb.sandbox.index import SandboxIndex
    from weknora_nb.sandbox.versions import VersionConfig

#: WeKnora's web UI's normal-mode agent (views/chat/index.vue:812-838 @ v0.7.2)
QUICK_ANSWER = "builtin-quick-answer"
#: C114: the intents :func:`classify_intent` gives; only ``kb_search`` runs retrieval
INTENTS = ("greeting", "chitchat", "kb_search")

_GREETINGS = frozenset([
    "你好", "您好", "你好呀", "你好啊", "您好呀", "嗨", "哈喽", "哈罗", "嗨你好", "早", "早上好", "上午好", "中午好",
    "下午好", "晚上好", "早安", "午安", "晚安", "大家好", "在吗", "在不在", "hi", "hello", "hey", "hi there",
    "hello there", "good morning", "good afternoon", "good evening"])
_CHITCHAT = frozenset([
    "你是谁", "你叫什么", "你叫什么名字", "你是什么", "你是机器人吗", "你是人吗", "你能做什么", "你会什么",
    "你会做什么",
    "你好吗", "最近怎么样", "谢谢", "谢谢你", "谢谢啦", "多谢", "感谢", "非常感谢", "好的", "好", "嗯", "嗯嗯", "哦",
    "ok", "okay", "哈哈", "哈哈哈", "再见", "拜拜", "回见", "bye", "goodbye", "thanks", "thank you", "thx",
    "who are you", "what can you do", "how are you", "nice to meet you", "很高兴认识你"])
#: what :func:`classify_intent` ignores: punctuation, symbols, spaces (and case)
_NOISE = re.compile(r"[\s\W_]+", re.UNICODE)


@dataclass(frozen=True)
class Agent:
    """An agent's retrieval overrides (``CustomAgentConfig``; applyAgentOverridesToChatManage,
    session_qa_helpers.go:199-219 @ v0.7.2): top-k and thresholds override config.yaml's when above 0, the rerank
    threshold always; query expansion and FAQ priority as the agent says (:222-265)."""

    id: str
    embedding_top_k: int
    vector_threshold: float
    keyword_threshold: float
    rerank_top_k: int
    rerank_threshold: float
    query_expansion: bool
    #: C119: FAQ priority (``faq_priority_enabled``) and its ``faq_score_boost``
    faq_priority: bool = False
    faq_score_boost: float = 1.0


#: C113: config/builtin_agents.yaml:25-47 @ v0.7.2 (v0.6.2, v0.6.3 and main the same values)
BUILTIN_AGENTS = {QUICK_ANSWER: Agent(QUICK_ANSWER, embedding_top_k=10, vector_threshold=0.5, keyword_threshold=0.3,
                                      rerank_top_k=10, rerank_threshold=0.3, query_expansion=True,
                                      faq_priority=True, faq_score_boost=1.2)}


def chat_settings(agent_id: str, *, rerank_model: bool) -> tuple[PipelineSettings, Agent | None]:
    """The settings a knowledge-chat with ``agent_id`` ("" for none) runs, and the agent that set them (None: no
    agent, or one that names none): config.yaml's without an agent (C66: no rerank model, so no rerank), else the
    agent's over them, reranking when ``rerank_model`` (the agent has the version's rerank model, C113)."""
    agent = BUILTIN_AGENTS.get(agent_id) if agent_id else None
    if agent is None:
        return CONVERSATION_SETTINGS, None
    s = CONVERSATION_SETTINGS
    return replace(s, embedding_top_k=agent.embedding_top_k or s.embedding_top_k,
                   vector_threshold=agent.vector_threshold or s.vector_threshold,
                   keyword_threshold=agent.keyword_threshold or s.keyword_threshold,
                   rerank_top_k=agent.rerank_top_k or s.rerank_top_k, rerank_threshold=agent.rerank_threshold,
                   rerank=rerank_model, query_expansion=agent.query_expansion,
                   faq_score_boost=agent.faq_score_boost if agent.faq_priority else 1.0), agent


def classify_intent(query: str) -> str:
    """The query's intent (C114) by the sandbox's rules (see the module docstring): ``greeting``, ``chitchat`` or
    ``kb_search``."""
    key = _NOISE.sub(" ", query.lower()).strip()
    if key in _GREETINGS:
        return "greeting"
    if key in _CHITCHAT or key.replace(" ", "") in _CHITCHAT:
        return "chitchat"
    return "kb_search"


def needs_retrieval(intent: str) -> bool:
    """``NeedsKBRetrieval`` (types/chat_manage.go:98-109 @ v0.7.2): only a knowledge-base search intent searches."""
    return intent == "kb_search"


def small_talk_answer(intent: str) -> str:
    """The sandbox's answer to a query that needs no retrieval (WeKnora's chat model answers it with the intent's
    system prompt; the sandbox has no model and says so)."""
    reply = "你好！我是知识库问答助手，请问有什么可以帮你？" if intent == "greeting" else \
        "我是知识库问答助手，可以根据知识库回答你的问题。"
    return f"（sandbox 未接入大模型，按规则识别为{intent}，未检索知识库。）{reply}"


def chat_variants(queries: Sequence[str], versions: Sequence[VersionConfig],
                  index_of: Callable[[VersionConfig], SandboxIndex]) -> list[str]:
    """The query variants (C115) that chats of ``queries`` search on any of ``versions`` (each over its index,
    ``index_of``), with config.yaml's settings or the web UI's agent's: what ``sandbox build --write-seed`` embeds
    ahead of time, so that a demo's chats need no embedding model."""
    out: dict[str, None] = {}
    for v in versions:
        engine = RetrievalEngine(index_of(v), v)
        for agent in ("", QUICK_ANSWER):
            settings, _ = chat_settings(agent, rerank_model=v.rerank_enabled)
            for q in queries:
                out.update(dict.fromkeys(expansion_variants(engine, q, settings)))
    return list(out)
