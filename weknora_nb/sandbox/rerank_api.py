"""``POST /v1/rerank``: the sandbox's rerank model behind the rerank API WeKnora's remote reranker calls (not a
WeKnora route; docs/weknora-contract.md C126), so that a WeKnora can rerank with the sandbox's model.

WeKnora's ``OpenAIReranker`` (internal/models/rerank/remote_api.go @ v0.7.2, the reranker of a model registered
with provider ``generic``) posts ``{base_url}/rerank`` with a bearer key and ``{"model", "query", "documents":
[str]}`` (``truncate_prompt_tokens`` only when the model's ``extra_config`` sets it), and reads ``{"id", "model",
"usage": {"total_tokens"}, "results": [{"index", "document": {"text"}, "relevance_score"}]}``. It uses the results
in the order given and takes the first as the best (rerank.go:380-410), so they come sorted by score, best first
(ties by index), as rerank APIs answer.

The model: ``multilingual-e5-small-q4``, multilingual-e5-small's cosine between the query (``query:`` prefix) and
each document (``passage:`` prefix), :class:`~weknora_nb.sandbox.embedders.E5Embedder`: the same scores the
sandbox's engine gets from its rerank model of that name for the same passages (:meth:`RetrievalEngine.rerank_scores
<weknora_nb.sandbox.engine.RetrievalEngine.rerank_scores>`). ``e5-bm25-features`` is not served: its BM25 feature
needs the sandbox's corpus, not a request's documents. Documents may also be objects with a ``text``; ``top_n``
(> 0) keeps that many results; ``truncate_prompt_tokens`` and ``additional_data`` are accepted and ignored.

Auth as ``/v1/embeddings``: a sandbox API key as bearer token. With the fault ``rerank_error_rate`` it answers
500, and WeKnora falls back to the retrieval order (C37).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from weknora_nb.core.jsontext import json_bytes
from weknora_nb.sandbox.embedders import E5Embedder
from weknora_nb.sandbox.judge import authorised_json, bad_request, estimate_tokens

if TYPE_CHECKING:
    from weknora_nb.sandbox.auth import KeyRing
    from weknora_nb.sandbox.engine import RetrievalEngine
    from weknora_nb.sandbox.faults import FaultInjector

#: the rerank models served: model name -> embedding model whose query-passage cosine is the score
RERANK_API_MODELS = {"multilingual-e5-small-q4": E5Embedder.name}
#: documents per request
MAX_DOCUMENTS = 1000



class RerankEndpoint:
    """The endpoint over one engine's index (its embedding models and caches); keys are the sandbox's."""

    def __init__(self, keys: KeyRing, engine: RetrievalEngine, faults: FaultInjector | None = None):
        self.keys = keys
        self.engine = engine
        self.faults = faults

    async def rerank(self, request: Request) -> Response:
        """Score the documents (module docstring); 401 without a sandbox key, 400 for a bad body, 404 another model,
        500 when the fault ``rerank_error_rate`` rolls."""
        body, refused = await authorised_json(request, self.keys)
        if refused is not None:
            return refused
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body["query"].strip():
            return bad_request(400, "the body must be a JSON object with a non-empty string query")
        documents = self._documents(body.get("documents"))
        if documents is None:
            return bad_request(400, f"documents must be a list of 1 to {MAX_DOCUMENTS} strings (or objects with a "
                               "text)")
        model = body.get("model")
        if model not in RERANK_API_MODELS:
            return bad_request(404, f"The model {model!r} does not exist; the sandbox reranks with "
                               f"{', '.join(sorted(RERANK_API_MODELS))}", code="model_not_found")
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0):
            return bad_request(400, "top_n must be a non-negative integer")
        if self.faults is not None and self.faults.roll(self.faults.cfg.rerank_error_rate,
                                                        request.scope.get("state", {}).get("fault_rng")):
            return JSONResponse({"error": {"message": "injected failure (sandbox fault)", "type": "server_error",
                                           "param": None, "code": None}}, status_code=500)
        scores = self.scores(model, body["query"], documents)
        order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
        if top_n:
            order = order[:top_n]
        results = [{"index": i, "document": {"text": documents[i]}, "relevance_score": float(scores[i])}
                   for i in order]
        tokens = estimate_tokens(body["query"]) + sum(estimate_tokens(d) for d in documents)
        answer = {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "usage": {"total_tokens": tokens},
                  "results": results}
        return Response(json_bytes(answer, allow_nan=False), media_type="application/json")

    def scores(self, model: str, query: str, documents: list[str]) -> np.ndarray:
        """The model's score of each document for ``query``: the cosine of their embeddings (both L2-normalised)."""
        embedder = self.engine.index.embedder(RERANK_API_MODELS[model])
        return np.asarray(embedder.passages(documents) @ embedder.query(query), dtype=np.float64)

    @staticmethod
    def _documents(value: Any) -> list[str] | None:
        if not isinstance(value, list) or not 0 < len(value) <= MAX_DOCUMENTS:
            return None
        texts = [d.get("text") if isinstance(d, dict) else d for d in value]
        return [t for t in texts if isinstance(t, str)] if all(isinstance(t, str) for t in texts) else None
