"""Pipeline stages as data: which endpoint and parameters measure which point of WeKnora's pipeline.

docs/method.md section 5: recall is measured at up to five points of one pipeline so the
loss can be located (their order and roles: :data:`weknora_nb.core.pipeline.PIPELINE`) —
``vector`` and ``keyword`` (one path each), ``hybrid`` (both paths merged, before rerank),
``final`` (after rerank and merge, what the user sees) — and optionally ``citations`` (the
references of a generated answer). A knowledge base of type ``faq`` is also searched by
``faq`` (``POST /api/v1/knowledge-bases/{id}/faq/search``, docs/weknora-contract.md C45/C46),
and has no keyword path (C20/C47).

A stage file (YAML) may redefine or add stages::

    stages:
      hybrid-100:
        endpoint: hybrid-search          # one of hybrid-search, knowledge-search, chat, faq-search
        params: {match_count: 100}       # optional: sent with every request
        keep_match_types: [0, 1]         # optional: the match types that count (null: all)

A custom stage's role in the pipeline follows from its endpoint and parameters
(:func:`weknora_nb.core.pipeline.role_of`). hybrid-search and faq-search stages always send
``match_count`` (:data:`DEFAULT_MATCH_COUNT` when the stage omits it); a hybrid-search
``match_count`` <= 0 is refused (C17: up to v0.7.2 it returns no hit, or fails with a 500).
faq-search stages send ``vector_threshold`` too (:data:`~weknora_nb.core.weknora.FAQ_VECTOR_THRESHOLD`,
the server's own default, C45, unless the stage sets one), so that the manifest states it. Chat stages
ask for the web UI's chat (:func:`with_chat_agent`: ``agent_id`` with ``agent_enabled: false``, C103).
Where each endpoint's retrieval settings come from is the stage's ``settings_source``
(:data:`weknora_nb.core.weknora.SETTINGS_SOURCES`; an agent's configuration for a chat naming one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weknora_nb.collect.run.system import UNBUILDABLE, _unbuildable
from weknora_nb.core.errors import ConfigError, Problem, UsageError
from weknora_nb.core.weknora import AGENT_SETTINGS, FAQ_VECTOR_THRESHOLD, SETTINGS_SOURCES

ENDPOINTS = ("hybrid-search", "knowledge-search", "chat", "faq-search")
#: the ``match_count`` hybrid-search and faq-search stages send when they name none (C17: main's default;
#: C45: the FAQ service's cap)
DEFAULT_MATCH_COUNT = 50
#: WeKnora match types that are search hits; 2-7 are context added around them
PRIMARY_MATCH_TYPES = (0, 1)


@dataclass(frozen=True)
class Stage:
    """A named measurement point: an endpoint, its parameters, and which match types count."""

    name: str
    endpoint: str
    params: dict[str, Any] = field(default_factory=dict)
    keep_match_types: tuple[int, ...] | None = PRIMARY_MATCH_TYPES

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise UsageError(argument=f"the endpoint of stage {self.name!r}", allowed=list(ENDPOINTS),
                             got=self.endpoint)
        problem = match_count_problem(self.endpoint, self.params)
        if problem is not None:
            raise UsageError(argument=f"match_count of stage {self.name!r}", allowed=problem,
                             got=self.params.get("match_count"))

    def request_params(self) -> dict[str, Any]:
        """Parameters sent: hybrid-search skips context enrichment unless the stage says otherwise, and
        hybrid-search and faq-search always send ``match_count`` (:data:`DEFAULT_MATCH_COUNT` by default);
        faq-search sends the vector threshold the server would apply anyway (0.7, C45) unless the stage sets one."""
        if self.endpoint == "hybrid-search":
            return {"skip_context_enrichment": True, "match_count": DEFAULT_MATCH_COUNT, **self.params}
        if self.endpoint == "faq-search":
            return {"match_count": DEFAULT_MATCH_COUNT, "vector_threshold": FAQ_VECTOR_THRESHOLD, **self.params}
        return dict(self.params)

    @property
    def settings_source(self) -> str:
        """Where the retrieval settings of this stage come from (``request``, ``tenant retrieval config``,
        ``server conversation config``, or ``agent configuration (<id>)`` for a chat naming an agent)."""
        agent = self.params.get("agent_id") if self.endpoint == "chat" else None
        if isinstance(agent, str) and agent:
            return f"{AGENT_SETTINGS} ({agent})"
        return SETTINGS_SOURCES[self.endpoint]

    def to_dict(self) -> dict[str, Any]:
        """The stage as the manifest records it: endpoint, parameters sent, match types kept, settings source."""
        return {"endpoint": self.endpoint, "params": self.request_params(),
                "keep_match_types": list(self.keep_match_types) if self.keep_match_types is not None else None,
                "settings_source": self.settings_source}


def with_chat_agent(stage: Stage, agent: str | None) -> Stage:
    """``stage`` asking for the web UI's chat when it is a chat stage and ``agent`` names an agent: its body
    gains ``agent_enabled: false`` and ``agent_id`` (C103: what the UI's normal mode sends; the agent's settings
    then replace config.yaml's, C66). A stage that sets either itself keeps its own; ``agent`` None: unchanged."""
    if stage.endpoint != "chat" or not agent:
        return stage
    return Stage(stage.name, stage.endpoint, {"agent_enabled": False, "agent_id": agent, **stage.params},
                 stage.keep_match_types)


def match_count_problem(endpoint: str, params: Mapping[str, Any]) -> str | None:
    """What ``match_count`` must be when a hybrid-search stage's is not allowed, else None.

    C17: up to v0.7.2 hybrid-search cuts the fused list to ``match_count``, so 0 returns no
    hit at all (a stage that silently scores 0) and a negative value panics (500).
    """
    if endpoint != "hybrid-search" or "match_count" not in params:
        return None
    value = params["match_count"]
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    return ("an integer >= 1 (WeKnora up to v0.7.2 returns no hit for match_count 0 and fails with a 500 for a "
            "negative one, docs/weknora-contract.md C17)")


#: the built-in stages, one per role of :data:`weknora_nb.core.pipeline.PIPELINE`, in its order
DEFAULT_STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("vector", "hybrid-search", {"disable_keywords_match": True, "match_count": 50}),
    Stage("keyword", "hybrid-search", {"disable_vector_match": True, "match_count": 50}),
    Stage("hybrid", "hybrid-search", {"match_count": 50}),
    Stage("final", "knowledge-search"),
    Stage("citations", "chat"),
)}
#: C45/C46: the FAQ search of a knowledge base of type ``faq``; every match type counts (FAQ entries carry
#: their own)
FAQ_STAGE = Stage("faq", "faq-search", {"match_count": DEFAULT_MATCH_COUNT}, keep_match_types=None)
#: every stage known by name: the pipeline's, then ``faq``
BUILT_IN_STAGES: dict[str, Stage] = {**DEFAULT_STAGES, FAQ_STAGE.name: FAQ_STAGE}

#: the stages collected unless asked otherwise: every retrieval stage of a document knowledge base;
#: none on the chat endpoint (it runs the LLM for every query). The collector adapts it to FAQ
#: knowledge bases (``faq`` added, ``keyword`` dropped where no base has a keyword path).
DEFAULT_SELECTION = ",".join(s.name for s in DEFAULT_STAGES.values() if s.endpoint != "chat")

_FIELDS = ("endpoint", "params", "keep_match_types")


def resolve_stages(names: str | Sequence[str | Stage], extra: Mapping[str, Stage] | None = None) -> list[Stage]:
    """Stage objects for ``"hybrid,final"`` or a list of names or Stage objects (built in, then ``extra``).

    A name given twice is collected once. :class:`UsageError` (``--stages``) for an unknown
    name, for no stage at all, or for two different stages of one name.
    """
    given = [n.strip() for n in names.split(",") if n.strip()] if isinstance(names, str) else list(names)
    known = {**BUILT_IN_STAGES, **(extra or {})}
    unknown = [n for n in given if not isinstance(n, Stage) and n not in known]
    if unknown:
        raise UsageError(argument="--stages", allowed=sorted(known), got=unknown)
    if not given:
        raise UsageError(argument="--stages", allowed="at least one stage (e.g. 'hybrid,final')", got=names)
    chosen: dict[str, Stage] = {}
    for n in given:
        stage = n if isinstance(n, Stage) else known[n]
        if chosen.setdefault(stage.name, stage) != stage:
            raise UsageError(f"--stages holds two different stages named {stage.name!r}")
    return list(chosen.values())


def load_stage_file(path: str | Path) -> dict[str, Stage]:
    """Stages defined in a YAML file (``stages: {name: {endpoint, params, keep_match_types}}``).

    :class:`~weknora_nb.core.errors.ConfigError` lists every problem of the file at once,
    each with its line and field (``stages.<name>.<field>``): a missing or unreadable file,
    YAML that does not parse, no ``stages`` mapping, a stage that is not a mapping, that has
    no or an unknown ``endpoint``, ``params`` that are not a mapping, ``keep_match_types``
    that is not a list of integers (or null: keep every match type).
    """
    p = str(path)
    data, lines = _read_yaml(path)
    stages = data.get("stages") if isinstance(data, dict) else None
    if not isinstance(stages, dict) or not stages:
        what = ("missing" if not isinstance(data, dict) or "stages" not in data
                else f"not a mapping of stage names to definitions (got {stages!r})")
        raise ConfigError(p, [Problem(p, lines.get(("stages",)), "stages",
                                      f"{what}; a stage file reads 'stages: {{<name>: {{endpoint: ..., params: "
                                      "...}}'")])
    problems: list[Problem] = []
    out: dict[str, Stage] = {}
    for name, spec in stages.items():
        found = _stage_problems(p, lines, name, spec)
        problems += found
        if not found:
            keep = spec.get("keep_match_types", list(PRIMARY_MATCH_TYPES))
            out[str(name)] = Stage(str(name), spec["endpoint"], dict(spec.get("params") or {}),
                                   tuple(keep) if keep is not None else None)
    if problems:
        raise ConfigError(p, problems)
    return out


def _stage_problems(path: str, lines: dict[tuple[str, ...], int], name: Any, spec: Any) -> list[Problem]:
    """What is wrong with one stage definition of a stage file (nothing: an empty list)."""
    key = ("stages", str(name))
    where = f"stages.{name}"
    if not isinstance(spec, dict):
        return [Problem(path, lines.get(key), where,
                        f"a stage must be a mapping with an 'endpoint' (one of {', '.join(ENDPOINTS)}); got {spec!r}")]
    problems = []
    if "endpoint" not in spec:
        problems.append(Problem(path, lines.get(key), f"{where}.endpoint",
                                f"missing: every stage needs one (one of {', '.join(ENDPOINTS)})"))
    elif spec["endpoint"] not in ENDPOINTS:
        problems.append(Problem(path, lines.get((*key, "endpoint")), f"{where}.endpoint",
                                f"must be one of {', '.join(ENDPOINTS)}; got {spec['endpoint']!r}"))
    params = spec.get("params")
    if params is not None and not isinstance(params, dict):
        problems.append(Problem(path, lines.get((*key, "params")), f"{where}.params",
                                f"must be a mapping of parameter to value; got {params!r}"))
    elif params is not None and (allowed := match_count_problem(str(spec.get("endpoint")), params)):
        problems.append(Problem(path, lines.get((*key, "params")), f"{where}.params.match_count",
                                f"must be {allowed}; got {params['match_count']!r}"))
    elif params is not None and (unsendable := _not_json(params)):
        problems.append(Problem(path, lines.get((*key, "params")), f"{where}.params",
                                f"must be values a JSON request body can hold (text, numbers, true/false, null, "
                                f"lists, mappings with text keys); {unsendable}"))
    keep = spec.get("keep_match_types", [])
    if keep is not None and not (isinstance(keep, list)
                                 and all(isinstance(x, int) and not isinstance(x, bool) for x in keep)):
        problems.append(Problem(path, lines.get((*key, "keep_match_types")), f"{where}.keep_match_types",
                                f"must be a list of integers (WeKnora match types, e.g. [0, 1]) or null; got {keep!r}"))
    return problems


def _not_json(params: dict[Any, Any]) -> str | None:
    """Why ``params`` cannot be sent as JSON and recorded in the manifest (None: they can): a date, bytes,
    a set, .nan or .inf, a key that is not text, nesting deeper than JSON encoders go."""
    def check(value: Any, depth: int) -> str | None:
        if depth > 100:
            return "they are nested too deeply"
        if isinstance(value, dict):
            bad = next((k for k in value if not isinstance(k, str)), None)
            if bad is not None:
                return f"got the key {bad!r}"
            return next((p for v in value.values() if (p := check(v, depth + 1))), None)
        if isinstance(value, list):
            return next((p for v in value if (p := check(v, depth + 1))), None)
        if isinstance(value, float) and not math.isfinite(value):
            return f"got {value!r}"
        if value is None or isinstance(value, (str, int, float)):
            return None
        return f"got a {type(value).__name__} ({str(value)[:40]!r})"
    return check(params, 0)


def _read_yaml(path: str | Path) -> tuple[Any, dict[tuple[str, ...], int]]:
    """The file's YAML document, and the line (1-based) of every mapping value by its key path
    (``("stages", "hybrid-100", "params")``); ConfigError when it cannot be read or parsed."""
    import yaml

    p = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(p, "the stage file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(p, f"the stage file cannot be read: {exc}") from None
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # reads the text: a character YAML does not allow fails here
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(p, [Problem(p, line, None, f"not valid YAML: {getattr(exc, 'problem', None) or exc}")]) \
            from None
    except UNBUILDABLE as exc:  # a scalar YAML cannot build (a date 2024-13-45, "!!int x"), or too deep
        raise ConfigError(p, [Problem(p, None, None, f"not valid YAML: {_unbuildable(exc)}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[tuple[str, ...], int] = {}
    _node_lines(node, (), lines)
    return data, lines


def _node_lines(node: Any, prefix: tuple[str, ...], out: dict[tuple[str, ...], int]) -> None:
    """Fill ``out`` with the line of each mapping value under ``node`` (at most three levels deep)."""
    import yaml

    if not isinstance(node, yaml.MappingNode) or len(prefix) >= 3:
        return
    for key, value in node.value:
        path = (*prefix, str(key.value))
        out[path] = value.start_mark.line + 1 if not isinstance(value, yaml.MappingNode) else key.start_mark.line + 1
        _node_lines(value, path, out)
