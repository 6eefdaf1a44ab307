""":func:`load_testset`: a test set loaded from a path, the format following the path."""

from __future__ import annotations

from pathlib import Path

from weknora_nb.core.errors import Problem, TestSetError
from weknora_nb.core.testset.csvfile import load_csv
from weknora_nb.core.testset.jsonl import load_jsonl
from weknora_nb.core.testset.model import TestSet
from weknora_nb.core.testset.parquetfile import load_parquet
from weknora_nb.core.testset.weknora_folder import load_weknora_folder


def load_testset(path: str | Path) -> TestSet:
    """Load and validate a test set; the format follows the path.

    - a folder: WeKnora dataset (``queries.parquet``, ``qrels.parquet``, optional
      ``answers.parquet`` and ``qas.parquet``);
    - ``.jsonl`` / ``.json``: canonical JSONL; ``.csv``; ``.parquet``.

    Raises
    ------
    FileNotFoundError
        The path does not exist.
    TestSetError
        Any validation problem; ``.problems`` lists every one with file, line and field.
        A file that cannot be read (a permission, bad bytes, a damaged Parquet file) is
        one too.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"test set not found: {p}")
    if p.is_dir():
        return load_weknora_folder(p)
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return load_jsonl(p)
    if suffix == ".csv":
        return load_csv(p)
    if suffix in (".parquet", ".pq"):
        return load_parquet(p)
    raise TestSetError(p, [Problem(str(p), None, None,
                                   f"unsupported test-set format {suffix!r}; expected .jsonl, .csv, "
                                   ".parquet or a WeKnora dataset folder (TREC qrels: load_trec_qrels)")])
