"""Test sets: load, validate, hash and export labelled queries.

A test set is a list of records (docs/method.md section 1)::

    {"query_id": "q001", "query": "...", "relevant": {"chunk-id": 3, "other-id": 1},
     "query_type": "procedural", "tags": ["long-tail"], "answer": "..."}

``query_type``, ``tags``, ``answer`` and ``weight`` (how often the query was asked in real
traffic, an integer >= 1, docs/method.md section 10) are optional. Grades are integers 0-3
(3 fully relevant, 2 highly relevant, 1 partly relevant, 0 not relevant); a chunk
absent from ``relevant`` has grade 0. A query with no grade >= 1 is *invalid*: it
stays in the test set, is excluded from every mean, and is counted and listed.

Formats read by :func:`load_testset`: canonical JSONL, CSV (``relevant`` as JSON text
or ``id:grade;id:grade``), Parquet, a WeKnora dataset folder (``queries.parquet``,
``qrels.parquet``, optional ``answers.parquet`` + ``qas.parquet``), and TREC qrels with
a topics file (:func:`load_trec_qrels`). Every problem is reported at once, with
file, line (or row) and field; nothing is half-loaded. Nothing collapses silently: a
key written twice in one JSON object, a chunk labelled twice, two ids that are equal once
surrounding whitespace is removed, a CSV quote that is never closed are all problems.

Files are read as a stream, and validated records are gathered in column batches, so that a large
test set is never held as one Python object per record. The modules:

- :mod:`~weknora_nb.core.testset.model`: :class:`TestSet` (two DataFrames), its content hash, its export;
- :mod:`~weknora_nb.core.testset.validate`: the rules of a record, and the record-by-record and bulk checks
  that apply them;
- :mod:`~weknora_nb.core.testset.builder`: validated records gathered as columns;
- one module per format: :mod:`~weknora_nb.core.testset.jsonl`, :mod:`~weknora_nb.core.testset.csvfile`,
  :mod:`~weknora_nb.core.testset.parquetfile`, :mod:`~weknora_nb.core.testset.trec`,
  :mod:`~weknora_nb.core.testset.weknora_folder`; what they share: :mod:`~weknora_nb.core.testset.textfile`
  (numbered lines of a text file) and :mod:`~weknora_nb.core.testset.parsing` (values written as text);
- :mod:`~weknora_nb.core.testset.load`: :func:`load_testset`, the format following the path.
"""

from weknora_nb.core.testset.load import load_testset as load_testset
from weknora_nb.core.testset.model import TestSet as TestSet
from weknora_nb.core.testset.trec import load_trec_qrels as load_trec_qrels
