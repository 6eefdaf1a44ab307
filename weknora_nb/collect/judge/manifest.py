"""A judge run's manifest (``<run>/judge.json``, or ``pairwise/<baseline>.json`` beside its log).

It records the judge: the model, server, parameters, prompts and their sha256, the reply schema, the token rule
and the prices, with an ``identity`` (the hash of what decides the judgements, so that judgements of another
judge are told apart); what the server said it was (``served_models``) and the parameters it refused; the
counts and the ledger of tokens and cost; and how the run ended (``complete``, ``incomplete``,
``stopped_by_max_cost``, ``interrupted``, ``failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weknora_nb.collect.judge.calls import TOKEN_RULE, Asker
from weknora_nb.collect.judge.llm import LLMClient, LLMSettings
from weknora_nb.collect.judge.options import JudgeOptions, JudgeOutcome
from weknora_nb.collect.judge.prompts import Prompt
from weknora_nb.collect.judge.store import JUDGEMENT_KEYS
from weknora_nb.core.errors import AuthFailed, NotFound, UsageError, reading, writing
from weknora_nb.core.files import atomic_path

#: the model name of the sandbox's deterministic rule-based judge (weknora_nb.sandbox.judge)
RULE_JUDGE_MODEL = "sandbox-rule-judge"
#: the model name of the sandbox's deterministic rule-based relevance grader (weknora_nb.sandbox.grader)
RULE_GRADER_MODEL = "sandbox-rule-grader"
#: what each rule-based model of the sandbox is, as a manifest's notes say it
RULE_MODELS = {
    RULE_JUDGE_MODEL: "the weknora-nb sandbox's deterministic rule-based judge (word overlap with the reference "
                      "answer and the cited passages), not a language model",
    RULE_GRADER_MODEL: "the weknora-nb sandbox's deterministic rule-based relevance grader (word overlap between "
                       "the question and the passage, lenient by one grade by design), not a language model"}


@dataclass
class JudgeSpec:
    """A judge run: its mode (``pointwise``, ``pairwise``), the run folder, where its log and manifest go, the
    judge's description (:func:`describe_judge`) and how many answers (or pairs of answers) it judges."""

    mode: str
    run_dir: Path
    log_path: Path
    manifest_path: Path
    description: dict[str, Any]
    answers: int
    #: the fields of a record that make its key (relevance grades: query_id, chunk_id, judge_repeat)
    keys: tuple[str, ...] = JUDGEMENT_KEYS


def describe_judge(settings: LLMSettings | None, options: JudgeOptions, prompts: dict[str, Prompt],
                   schema: dict[str, Any]) -> dict[str, Any]:
    """What decides the judgements (its ``identity`` is their hash) and what only describes the run."""
    identity = {"model": settings.model if settings else None,
                "temperature": options.temperature, "max_tokens": options.max_tokens, "seed": options.seed,
                "prompt_version": options.prompt_version,
                "prompts": {p.name: {"file": f"{p.name}.txt", "sha256": p.sha256} for p in prompts.values()},
                "language": options.language}
    return {**identity, "identity": "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
            .hexdigest(), "server": settings.server if settings else None,
            "api_key_env": settings.api_key_env if settings else None, "schema": schema,
            "parse_retries": options.parse_retries, "token_rule": TOKEN_RULE,
            "prices_per_million_tokens": {"prompt": options.price_in, "completion": options.price_out},
            "max_cost": options.max_cost}


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at ``path`` ({} when there is none yet)."""
    if not path.is_file():
        return {}
    with reading(path):
        data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def start_manifest(spec: JudgeSpec, options: JudgeOptions) -> dict[str, Any]:
    """The manifest of a run that starts (``running``), written; the command line with its URLs redacted."""
    manifest = {"mode": spec.mode, "run": str(spec.run_dir), "judgements": spec.log_path.name,
                "judge": spec.description, "repeats": options.repeats, "concurrency": options.concurrency,
                "status": "running", "started_at": now(), "command": command_line()}
    write_manifest(spec.manifest_path, manifest)
    return manifest


def end_manifest(spec: JudgeSpec, manifest: dict[str, Any], outcome: JudgeOutcome, asker: Asker,
                 client: LLMClient, status: str) -> None:
    """The manifest with what the server said it was, the parameters it refused, the counts and the ledger."""
    models = sorted(asker.models | {str(r["model"]) for r in outcome.records if r.get("model")})
    notes = [f"{m} is {RULE_MODELS[m]}" for m in models if m in RULE_MODELS]
    ledger = {"calls": sum(len(r.get("calls") or []) for r in outcome.records),
              "prompt_tokens": sum(c["prompt_tokens"] for r in outcome.records for c in r.get("calls") or []),
              "completion_tokens": sum(c["completion_tokens"] for r in outcome.records for c in r.get("calls") or []),
              "cost": sum(float(r.get("cost") or 0.0) for r in outcome.records)}
    if status == "done":
        status = "stopped_by_max_cost" if outcome.stopped_by_max_cost else \
            "complete" if outcome.complete else "incomplete"
    manifest.update(status=status, ended_at=now(), served_models=models,
                    rule_based=any(m in RULE_MODELS for m in models),
                    dropped_parameters=sorted(client.dropped), notes=notes, counts=outcome.counts(), ledger=ledger)
    write_manifest(spec.manifest_path, manifest)


def stopped_manifest(path: Path, manifest: dict[str, Any], status: str, why: str) -> None:
    """The manifest of LLM work that stopped before its end (``interrupted``, ``failed``), written to ``path``:
    why, and when."""
    manifest.update(status=status, stopped_by=why[:500], ended_at=now())
    write_manifest(path, manifest)


@contextmanager
def stops_recorded(path: Path, manifest: dict[str, Any]) -> Iterator[None]:
    """Run the body; a stop before its end is written into the manifest at ``path`` (:func:`stopped_manifest`) and
    raised again: a refused key or an unknown model ``failed`` (as a :class:`UsageError`: the user's to fix), Ctrl-C
    or a cancellation ``interrupted``, any other error ``failed`` with its type."""
    try:
        yield
    except (AuthFailed, NotFound) as exc:
        stopped_manifest(path, manifest, "failed", str(exc))
        raise UsageError(str(exc)) from None
    except (asyncio.CancelledError, KeyboardInterrupt):
        stopped_manifest(path, manifest, "interrupted", "interrupted (Ctrl-C)")
        raise
    except BaseException as exc:
        stopped_manifest(path, manifest, "failed", f"{type(exc).__name__}: {exc}")
        raise


def command_line() -> list[str]:
    """This process's command line with its URLs' secrets redacted."""
    from weknora_nb.collect.http.redact import redact_command

    return redact_command(sys.argv)


def write_manifest(path: Path, obj: Any) -> None:
    """Write the JSON ``obj`` to ``path`` atomically (the whole file or nothing)."""
    with writing(path), atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=2)


def now() -> str:
    """The time now, UTC, ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")
