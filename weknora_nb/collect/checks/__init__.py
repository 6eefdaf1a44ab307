"""The integrity checks of a knowledge base (``weknora-nb check``): through the API and, with a read-only DSN,
in WeKnora's Postgres.

:mod:`.integrity` runs them (:func:`~.integrity.run_checks`); :mod:`.database` checks the vectors in Postgres,
in a read-only session (:mod:`.postgres`) with WeKnora's own vector query (:mod:`.vector_search`);
:mod:`.vectortrace` traces the test set's queries into the vector store, embedded by the knowledge base's model
(:mod:`.embeddings`), to split a vector miss into an index miss and an embedding miss.
"""
