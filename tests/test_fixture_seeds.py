"""The test fixtures' embedding seeds hold every passage their sandboxes embed (so a test run embeds almost nothing).

A data folder's ``cache/`` is the sandbox's read-only seed (weknora_nb/sandbox/runner.py: ``build_index``): the
passage embeddings ``embeddings-<model>.npz`` and query embeddings ``queries-<model>.npz``, keyed by
``Embedder.key`` (sha256 of model name and text). The fixtures ship two:

- ``tests/fixtures/mini_kb/cache/``: the mini knowledge base, alone and with ``faq_small.jsonl`` as its FAQ
  knowledge base (tests/test_history.py, tests/test_curation_e2e.py, tests/test_contract_search.py build such
  folders), every FAQ index mode;
- ``tests/fixtures/big_seed/``: the big document of ``conftest.write_big_documents`` (which copies the seed into
  the folder's ``cache/``) with the FAQ entries of tests/test_client_weknora.py and tests/test_contract_api.py.

Their texts are derived here the way the index derives them (``SandboxIndex.texts``), without the models; the
queries are those the tests send over these folders (``tests/fixtures/seed_queries.json``). ``tools/
write_test_seeds.py`` writes the seeds from :func:`seed_passages` and the query list, and these tests fail when a
fixture, the chunking or the index texts changed without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from weknora_nb.sandbox.chunking import FAQ_INDEX_MODES, FAQ_QUESTION_INDEX_MODES, Chunk, corpus_chunks
from weknora_nb.sandbox.embedders import EMBEDDERS, E5Embedder, UseEmbedder
from weknora_nb.sandbox.index import SandboxIndex
from weknora_nb.sandbox.versions import VersionConfig

from .conftest import BIG_SEED, write_big_documents

FIXTURES = Path(__file__).parent / "fixtures"
MINI = FIXTURES / "mini_kb"
FAQ_SMALL = FIXTURES / "faq_small.jsonl"
#: the query texts the tests send over each seed's folders, per model (``tools/write_test_seeds.py --record``)
SEED_QUERIES = FIXTURES / "seed_queries.json"
#: each seed's folder
SEEDS = {"mini_kb": MINI / "cache", "big": BIG_SEED}
#: per seed, what each model embeds of its folders' chunks: the vector model the index texts and the FAQ index
#: entries (mini_kb: of every FAQ index mode, C49, as tests pick several; big: of the default mode, its versions'),
#: the reranker's model the cleaned passages (C35; the big folders' versions register no rerank model)
FAQ_ROLES = tuple(f"faq:{i}:{q}" for i in FAQ_INDEX_MODES for q in FAQ_QUESTION_INDEX_MODES)
ROLES: dict[str, dict[str, tuple[str, ...]]] = {
    "mini_kb": {UseEmbedder.name: ("index", *FAQ_ROLES), E5Embedder.name: ("rerank",)},
    "big": {UseEmbedder.name: ("index", VersionConfig("default").faq_role)}}
#: a seed file's size limit (bytes): the seeds are committed
MAX_SEED_BYTES = 1_500_000
STALE = "run tools/write_test_seeds.py (a fixture, the chunking or the index texts changed)"


def _folder(root: Path, docs: Path | None, faq_entries: list[dict] | None) -> Path:
    """A data folder ``root`` as the tests build it: ``docs`` linked (or the big documents written when None),
    ``faq_entries`` as its FAQ knowledge base."""
    root.mkdir(parents=True)
    if docs is None:
        write_big_documents(root, seed=False)
    else:
        (root / "docs").symlink_to(docs, target_is_directory=True)
    if faq_entries is not None:
        (root / "faq").mkdir()
        (root / "faq" / "faq.jsonl").write_text("".join(json.dumps(e, ensure_ascii=False) + "\n"
                                                        for e in faq_entries), encoding="utf-8")
    return root


def seed_folders(scratch: Path) -> dict[str, list[Path]]:
    """Per seed, the data folders whose chunks it covers, built under ``scratch`` as the tests build them."""
    from .test_client_weknora import FAQ_ENTRIES as CLIENT_FAQ
    from .test_contract_api import FAQ_ENTRIES as CONTRACT_FAQ

    small = [json.loads(line) for line in FAQ_SMALL.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {"mini_kb": [MINI, _folder(scratch / "mini-faq", MINI / "docs", small)],
            "big": [_folder(scratch / "big-client", None, CLIENT_FAQ),
                    _folder(scratch / "big-contract", None, CONTRACT_FAQ)]}


def passage_texts(chunks: list[Chunk], roles: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Per model, the passages a sandbox over ``chunks`` embeds for ``roles``, as its index derives them
    (``SandboxIndex.texts``: ``passage_vectors`` / ``row_vectors`` embed exactly these)."""
    index = SandboxIndex(chunks)
    return {model: list(dict.fromkeys(t for role in rs for t in index.texts(role))) for model, rs in roles.items()}


def seed_passages(scratch: Path) -> dict[str, dict[str, list[str]]]:
    """Per seed and model, the passage texts the seed must hold (deduplicated, in index order)."""
    out: dict[str, dict[str, list[str]]] = {}
    for seed, folders in seed_folders(scratch).items():
        texts: dict[str, dict[str, None]] = {model: {} for model in ROLES[seed]}
        for folder in folders:
            for model, got in passage_texts(corpus_chunks(folder), ROLES[seed]).items():
                texts[model].update(dict.fromkeys(got))
        out[seed] = {model: list(t) for model, t in texts.items()}
    return out


def seed_queries() -> dict[str, dict[str, list[str]]]:
    """Per seed and model, the query texts the seed must hold."""
    return json.loads(SEED_QUERIES.read_text(encoding="utf-8"))


def seed_of(chunks: list[Chunk]) -> str | None:
    """The seed a sandbox over ``chunks`` reads (for recording its queries): the folder holds the big document, or
    the mini knowledge base's documents; None for any other."""
    ids = {c.knowledge_id for c in chunks}
    if "big.long" in ids:
        return "big"
    mini = {c.knowledge_id for c in corpus_chunks(MINI)}
    return "mini_kb" if mini <= ids else None


def _keys(f: Path) -> set[str]:
    with np.load(f) as z:
        return set(z["keys"].tolist())


@pytest.fixture(scope="module")
def passages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, list[str]]]:
    return seed_passages(tmp_path_factory.mktemp("seed-folders"))


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_every_fixture_passage_is_in_its_seed(passages, seed):
    for model, texts in passages[seed].items():
        f = SEEDS[seed] / f"embeddings-{model}.npz"
        if not texts:
            continue
        assert f.is_file(), f"{f} is missing: {STALE}"
        keys = _keys(f)
        missing = [t for t in texts if EMBEDDERS[model].key(t) not in keys]
        assert not missing, (f"{len(missing)} of {len(texts)} passages are not in {f.relative_to(FIXTURES)}, e.g. "
                             f"{missing[0][:60]!r}: {STALE}")


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_every_listed_query_is_in_its_seed(seed):
    for model, texts in seed_queries().get(seed, {}).items():
        f = SEEDS[seed] / f"queries-{model}.npz"
        assert f.is_file(), f"{f} is missing: run tools/write_test_seeds.py"
        keys = _keys(f)
        missing = [t for t in texts if EMBEDDERS[model].key(t) not in keys]
        assert not missing, (f"{len(missing)} of {len(texts)} queries of {SEED_QUERIES.name} are not in "
                             f"{f.relative_to(FIXTURES)}, e.g. {missing[0]!r}: run tools/write_test_seeds.py")


def test_the_seeds_are_small_and_hold_what_write_seed_writes():
    files = sorted(f for folder in SEEDS.values() for f in folder.iterdir())
    assert files and all(f.suffix == ".npz" for f in files), files
    for f in files:
        assert f.stat().st_size < MAX_SEED_BYTES, f"{f.name} is {f.stat().st_size} bytes"
        with np.load(f) as z:
            model = f.stem.split("-", 1)[1]
            dims = {UseEmbedder.name: 512, E5Embedder.name: 384}[model]
            assert z["keys"].dtype == np.dtype("U64") and z["vecs"].dtype == np.float32
            assert z["vecs"].shape == (len(z["keys"]), dims)
            assert np.allclose((z["vecs"] ** 2).sum(axis=1), 1.0, atol=1e-3)  # L2-normalised


def test_the_big_documents_come_with_their_seed(tmp_path):
    (tmp_path / "cache").mkdir()  # a folder that has a cache already keeps it, the seed added
    (tmp_path / "cache" / "other.txt").write_text("x", encoding="utf-8")
    write_big_documents(tmp_path)
    got = {f.name: f.read_bytes() for f in (tmp_path / "cache").iterdir()}
    assert got.pop("other.txt") == b"x"
    assert got == {f.name: f.read_bytes() for f in BIG_SEED.iterdir()}
    write_big_documents(tmp_path / "again", seed=False)
    assert not (tmp_path / "again" / "cache").exists()


@pytest.mark.parametrize("model", [UseEmbedder.name, E5Embedder.name])
def test_the_real_models_give_what_the_seeds_hold(model):
    """The seeds stand in for the models in most tests, so the models themselves run here: a few passages and
    queries embedded afresh (no cache, no seed) equal their seeded vectors. A new model package that embeds
    differently fails here (the seeds' keys name the model, not its version): run tools/write_test_seeds.py
    --fresh."""
    embedder = EMBEDDERS[model](None)
    for kind, embed in (("embeddings", embedder.passages), ("queries", embedder.queries)):
        with np.load(MINI / "cache" / f"{kind}-{model}.npz") as z:
            seeded = dict(zip(z["keys"].tolist(), z["vecs"], strict=True))
        texts = (seed_queries()["mini_kb"][model] if kind == "queries"
                 else passage_texts(corpus_chunks(MINI), ROLES["mini_kb"])[model])[:3]
        fresh = embed(texts)
        want = np.stack([seeded[embedder.key(t)] for t in texts])
        cosine = (fresh * want).sum(axis=1) / np.linalg.norm(fresh, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() > 0.9999, f"{model} {kind}: cosine {cosine.min():.6f} to the seed: {STALE} --fresh"
