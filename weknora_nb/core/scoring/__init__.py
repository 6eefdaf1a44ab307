"""Score a results table against a test set (docs/method.md sections 2-3).

:func:`score` runs these steps, all vectorised (no Python loop over queries), on integer
codes (:class:`~weknora_nb.core.codes.ResultCodes`; a Parquet path is read straight into
them, :mod:`~weknora_nb.core.scoring.inputs`):

1. group rows into requests (:func:`~weknora_nb.core.requests.prepare`): runs of equal (query, stage,
   repeat); rows are sorted only when a request's rows lie apart or out of rank order;
2. check structure (there too): one status per request, no rank given twice;
3. set aside what is not scored, with the reason (:mod:`~weknora_nb.core.scoring.selection`): invalid
   queries (no grade >= 1), failed requests (status other than ``ok``), requests of unknown query ids;
   valid queries missing from a stage/repeat that other queries have are added as ``missing`` requests
   in step 6;
4. lay the requests out as rows of a grid (:mod:`weknora_nb.core.requests`); rows holding a
   repeated chunk id are found by sorting each row, and every row keeps its first K_max
   distinct chunk ids (first position kept, ranks closed up, duplicates counted over the
   whole list);
5. look up the grades (>= 1 only: grade 0 adds nothing) and compute every metric
   (:mod:`~weknora_nb.core.scoring.relevance`, then :func:`~weknora_nb.core.metrics.compute`);
6. the tables: requests (missing requests included), per_query, excluded, by_repeat,
   summary; then the counts and the warnings (:mod:`~weknora_nb.core.scoring.tables`).

A stage's figure is the mean over its queries of each query's mean over its scored repeats (the basis of every
interval and test of the stage, docs/method.md section 2), with the spread between repeats beside it.

Steps 1, 2 and 4 need no test set (:mod:`weknora_nb.core.requests`: the results' side, every request's list
laid out as if it were scored; step 3 then empties those not scored). The test set's labels
(:class:`~weknora_nb.core.scoring.relevance.Relevance`) are prepared in a second thread while the results are
read and grouped (Arrow and numpy work without the interpreter lock). :func:`score_files` does the whole
results' side in a thread while the test set loads, and hashes the test set while scoring
(:mod:`~weknora_nb.core.scoring.entry`). What comes out: :class:`Scores` and :class:`Counts`
(:mod:`~weknora_nb.core.scoring.scores`); :meth:`Scores.to_json_bytes` writes ``--json`` with orjson, the
per-query rows as Arrow strings (:mod:`~weknora_nb.core.scoring.json_rows`); :meth:`Scores.write_per_query`
writes them to a file instead (``--per-query-out``).
"""

from weknora_nb.core.scoring.entry import score as score
from weknora_nb.core.scoring.entry import score_files as score_files
from weknora_nb.core.scoring.inputs import result_codes as result_codes
from weknora_nb.core.scoring.scores import NO_ROWS as NO_ROWS
from weknora_nb.core.scoring.scores import NO_TESTSET_ROW as NO_TESTSET_ROW
from weknora_nb.core.scoring.scores import NO_VALID_QUERY as NO_VALID_QUERY
from weknora_nb.core.scoring.scores import Counts as Counts
from weknora_nb.core.scoring.scores import Scores as Scores
from weknora_nb.core.scoring.scores import per_query_format as per_query_format
