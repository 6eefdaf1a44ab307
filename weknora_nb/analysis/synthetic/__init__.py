"""Generated test sets (docs/method.md section 17), their pure side: the plan under quotas (:mod:`.plan`), the
filters, the selection, the records and the closing note (:mod:`.curate`), the lexical overlap of a question with
its chunk (:mod:`.overlap`), and the figures split by source with the warnings a report shows (:mod:`.bias`).

The calls (generation, the answerability check, the round trip) are made by ``weknora_nb.collect.generate``,
which is given a :class:`~.curate.SyntheticCurator` to decide what to ask and what to keep.
"""
