"""``POST /v1/embeddings``: the sandbox's embedding model behind OpenAI's embeddings format (not a WeKnora
route; what WeKnora itself calls, C95), so that ``weknora-nb check --embeddings-url`` can embed the test set's
queries with the model the knowledge base was indexed with.

Request ``{"model", "input": str | [str], "encoding_format": "float"}`` with a sandbox API key as bearer
token; the model must be the served version's (``use-multilingual-v3`` by default). The answer is
``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}``, the
vectors in input order, each what the engine searches with for that text (the query side of the model).

With the fault ``embedding_error_rate`` it answers 429 (:data:`RATE_LIMITED_BODY`, a provider's rate limit),
what WeKnora's search then does is docs/weknora-contract.md C121.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from weknora_nb.core.jsontext import json_bytes
from weknora_nb.sandbox.judge import authorised_json, bad_request, estimate_tokens

if TYPE_CHECKING:
    from weknora_nb.sandbox.auth import KeyRing
    from weknora_nb.sandbox.engine import RetrievalEngine
    from weknora_nb.sandbox.faults import FaultInjector


#: inputs per request (OpenAI's limit is 2048)
MAX_INPUTS = 2048
#: the 429 body of a rate-limited embedding call (OpenAI's shape; the sandbox's fault ``embedding_error_rate``)
RATE_LIMITED_BODY = json_bytes({"error": {"message": "Rate limit reached (injected failure (sandbox fault))",
                                          "type": "rate_limit_error", "param": None, "code": "rate_limit_exceeded"}})
#: how WeKnora's embedding client reports it (embedding/openai.go:226-233 @ v0.7.2; recording 80, C121)
EMBEDDING_FAILURE = f"EmbedBatch API error: Http Status 429 Too Many Requests, Response: {RATE_LIMITED_BODY.decode()}"



class EmbeddingsEndpoint:
    """The endpoint over one engine's embedding model; keys are the sandbox's."""

    def __init__(self, keys: KeyRing, engine: RetrievalEngine, faults: FaultInjector | None = None):
        self.keys = keys
        self.engine = engine
        self.faults = faults

    @property
    def model(self) -> str:
        return self.engine.version.embedding_model

    async def embeddings(self, request: Request) -> Response:
        """Embed the inputs (module docstring); 401 without a sandbox key, 400 for a bad body, 404 another model."""
        body, refused = await authorised_json(request, self.keys)
        if refused is not None:
            return refused
        if not isinstance(body, dict):
            return bad_request(400, "the body must be a JSON object")
        inputs = self._inputs(body.get("input"))
        if inputs is None:
            return bad_request(400, f"input must be a non-empty string or a list of 1 to {MAX_INPUTS} non-empty "
                               "strings")
        if body.get("model") != self.model:
            return bad_request(404, f"The model {body.get('model')!r} does not exist; the sandbox embeds with "
                               f"{self.model!r}", code="model_not_found")
        if body.get("encoding_format", "float") != "float":
            return bad_request(400, "encoding_format must be 'float' (the sandbox does not send base64)")
        if self.faults is not None and self.faults.roll(self.faults.cfg.embedding_error_rate,
                                                        request.scope.get("state", {}).get("fault_rng")):
            return Response(RATE_LIMITED_BODY, status_code=429, media_type="application/json")
        embedder = self.engine.index.embedder(self.model)
        data = [{"object": "embedding", "index": i, "embedding": [float(x) for x in embedder.query(text)]}
                for i, text in enumerate(inputs)]
        tokens = sum(estimate_tokens(t) for t in inputs)
        body = {"object": "list", "data": data, "model": self.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Response(json_bytes(body, allow_nan=False), media_type="application/json")   # JSONResponse's JSON

    @staticmethod
    def _inputs(value: Any) -> list[str] | None:
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list) or not 0 < len(texts) <= MAX_INPUTS:
            return None
        if not all(isinstance(t, str) and t for t in texts):
            return None
        return texts
