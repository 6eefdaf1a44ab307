"""The LLM judge: every answer of a run rated for correctness, faithfulness and relevance, 1-5 each.

Inputs, from a run folder (:mod:`weknora_nb.core.run`): ``answers.jsonl`` (one line per chat answer:
``query_id``, ``stage``, ``repeat``, ``answer``, ``citations``, the cited chunk ids in citation order),
``chunks.parquet`` (the cited chunks' text) and the test set the manifest names (each query's text
and reference ``answer``). Each answer is judged ``repeats`` times (judge repeats ``1..repeats``):

- **correctness** against the reference answer (None when the test set gives none), **faithfulness**
  against the cited passages only, **relevance** to the question; the prompt is Chinese or English
  by the question's script (``language="auto"``), versioned (:mod:`.prompts`).
- A reply is read strictly; an invalid one is asked again (``parse_retries`` times, the request
  then carrying the bad reply and what was wrong with it) and then recorded as failed with its kind
  (``unparseable``, ``schema``, ``out_of_range``) and raw text, never as a score. A request that fails
  records the :class:`~weknora_nb.core.errors.RequestFailed` kind (``timeout``, ``rate_limited``,
  ``connect``, ``server``, ``protocol``, ``bad_request``) after the client's retries. A key the server
  refuses, or a model it does not have, stops the run: a :class:`UsageError`.
- Seeds: judge repeat r, attempt a sends ``seed + 1000 (r - 1) + (a - 1)`` (servers that refuse
  ``seed`` get none); with ``temperature`` > 0 repeats can differ, which is what their spread measures.
- **Cache** (:class:`~.store.JudgeCache`): the key is the sha256 of the
  model, temperature, max_tokens, the judge repeat and its seed, the prompt's name and sha256, and
  the messages (question, reference, context and answer as sent): not the server's address, which
  may change (the sandbox's port) while the model stays; a server whose model changes under the
  same name needs its own ``cache``. Answers that are the same text (a deterministic system's
  repeats) share one call. A rerun makes no call.
- **Ledger**: every call's tokens as the server reported them (``usage``), or estimated by
  :func:`~.llm.estimate_tokens` when it reported none (``"usage": "estimated"``);
  cost = prompt tokens x ``price_in`` + completion tokens x ``price_out``, prices per million tokens.
- **Cost limit** (``max_cost``): before each call its cost is reserved: the estimated prompt tokens
  times ``max(1.25, 1.1 x`` the largest reported/estimated ratio seen``)``, plus ``max_tokens`` completion
  tokens (a server never exceeds it). A call whose reservation would take spent + reserved past the
  limit is not made, and no further call is: the run stops (exit 1), what was judged is kept.
- **Dry run**: the judgements still to make, the calls they need (cached ones excluded), their
  estimated prompt tokens and, with ``max_tokens`` completion tokens each, an upper bound of the cost.
- **Resumable**: each finished judgement is one line of ``<run>/judgements.jsonl`` (flushed and
  fsync-ed, :class:`~.store.JudgementLog`); a rerun judges only what is not
  there (``retry_failed``: the failed ones too), so nothing is judged twice and no line is doubled.
  ``<run>/judge.json`` records the judge (model, server, parameters, prompts and their sha256, the
  reply schema, the token rule, prices), what the server said it was (``served_models``) and the
  counts; judgements of a different judge in the same folder are refused unless ``replace``.

Pairwise (:func:`.pairwise.judge_pairwise`): the same machinery over two runs, see its docstring.

The modules: :mod:`.options` (how to judge, what a run did), :mod:`.pointwise` and :mod:`.pairwise` (the
entry points: :func:`~.pointwise.judge_run`, :func:`~.pairwise.judge_pairwise`), :mod:`.inputs` (a run's
answers and their passages), :mod:`.prompts` (the prompts and the strict reading of replies), :mod:`.calls`
(one request through the cache and the cost limit), :mod:`.runner` (the workers, the dry run),
:mod:`.manifest` (``judge.json``), :mod:`.store` (cache, judgement log, lock), :mod:`.llm` (the
OpenAI-compatible client).
"""
