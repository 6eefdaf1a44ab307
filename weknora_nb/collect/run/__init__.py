"""The collection of a run: every query of a test set at every stage, over HTTP, into a resumable run folder.

:mod:`.collector` runs it (:func:`~.collector.collect`); its steps: :mod:`.arguments` (checked),
:mod:`.preflight` (what the server says before anything is written), :mod:`.folder` (the run folder and its
manifest), :mod:`.lock` (one collector per run folder), :mod:`.requests` (plan, probe, warm-up, requests),
:mod:`.checkpoint` (one line per finished request), :mod:`.inventory` (the chunk inventory),
:mod:`.snapshot` (the knowledge base at the start and at the end, compared), :mod:`.sessions` (the chat
sessions the run created, deleted), :mod:`.results` (the results table and the summary). What is measured:
:mod:`.stages` (stages as data) and :mod:`.system` (the user's description of the system).
"""
