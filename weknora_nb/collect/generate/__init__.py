"""``weknora-nb testset generate``, the collector's side: questions written by an OpenAI-compatible model from a
knowledge base's chunks, checked, searched back, and written as a test set (docs/method.md section 17).

The modules: :mod:`.run` (the entry point, :func:`~.run.generate_testset`, and its rounds), :mod:`.work` (the
calls: a question, its check, its round trip), :mod:`.prompts` (the versioned prompts and the strict reading of
their replies), :mod:`.store` (the log, the manifest, the lock, the cache's place). The judge's machinery
(``weknora_nb.collect.judge``: the client, the cache, the cost limit, the strict reading with its retries, the
prompt files) makes every call; the plan, the filters and the records are ``weknora_nb.analysis.synthetic``'s.
"""
