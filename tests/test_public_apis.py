"""The package uses other libraries through their public APIs only and leaves the process to its user
(the brief's rule 5): no process tuning, no private name of another package, one concept per module
(at most 600 lines), no import circle."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "weknora_nb"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "demo" not in p.relative_to(PACKAGE).parts[:2])
#: what importing runs a program (``python -m weknora_nb``)
PROGRAMS = {PACKAGE / "__main__.py"}
MAX_LINES = 600

#: process tuning and private names of other packages that were once here (each a regular expression)
FORBIDDEN = re.compile(
    r"mallopt|prctl|os\._exit|os\.fork\(|gc\.disable\(|gc\.freeze\(|gc\.set_threshold|setswitchinterval"
    r"|set_task_factory|client_reqrep|\._merge_url|\._init_transport|_aiohttp_response|__cpu_features__"
    r"|\._init_resources|_async_cleanup_resources|_async_interrupt_kernel|_handle_kernel_info_reply"
    r"|NUMPY_MADVISE_HUGEPAGE|MALLOC_|PYTHONMALLOC|sys\.setrecursionlimit")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_process_tuning_and_no_known_private_name(path: Path):
    hits = [f"line {i}: {line.strip()}" for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if FORBIDDEN.search(line)]
    assert not hits, "\n".join(hits)


def _foreign_private_uses(tree: ast.AST) -> list[str]:
    """Imports of another package's private modules or names, private attributes of another package's modules
    (``np._core``), ``super()._name`` (an override reaching into a base class's internals) and
    ``getattr(x, "_name")``."""
    foreign_modules: set[str] = set()   # local names bound to modules of other packages
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not a.name.startswith("weknora_nb"):
                    if any(_is_private(part) for part in a.name.split(".")):
                        found.append(f"line {node.lineno}: import {a.name}")
                    foreign_modules.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith("weknora_nb"):
            parts = (node.module or "").split(".")
            names = [a.name for a in node.names]
            if any(_is_private(p) for p in parts) or any(_is_private(n) for n in names):
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(names)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in foreign_modules:
                found.append(f"line {node.lineno}: {value.id}.{node.attr}")
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                found.append(f"line {node.lineno}: super().{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_of_another_package_is_used(path: Path):
    found = _foreign_private_uses(ast.parse(path.read_text(encoding="utf-8")))
    assert not found, "\n".join(found)


def test_the_check_sees_private_uses():
    code = ("import numpy as np\nfrom numpy._core import x\nfrom httpx import _utils\nclass A(B):\n"
            "    def f(self):\n        np._core\n        super()._merge_url(1)\n        getattr(self, '_cookies')\n")
    assert [f.split(":")[0] for f in _foreign_private_uses(ast.parse(code))] == [
        "line 2", "line 3", "line 6", "line 7", "line 8"]


def _classes() -> list[type]:
    out = []
    for path in sorted(set(SOURCES) - PROGRAMS):
        try:
            module = importlib.import_module(_module(path))
        except ImportError as exc:   # an optional part whose extra is not installed
            pytest.skip(f"{_module(path)}: {exc}")
        out += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return out


def test_no_class_overrides_a_private_member_of_another_package():
    """A class of ours that defines ``_name`` which a base class of another package also has is reaching into
    that package's internals."""
    found = []
    for cls in _classes():
        foreign = [b for b in cls.__mro__[1:] if not b.__module__.startswith("weknora_nb") and b is not object]
        for name, member in vars(cls).items():
            method = inspect.isfunction(member) or isinstance(member, (property, staticmethod, classmethod))
            if method and _is_private(name) and not name.startswith(f"_{cls.__name__}__"):
                owners = [b.__qualname__ for b in foreign if name in vars(b)]
                if owners:
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{name} (of {owners[0]})")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_holds_more_than_600_lines(path: Path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{n} lines: one concept per module fits in less"


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of weknora_nb that ``path`` imports anywhere (TYPE_CHECKING blocks included): ``from a import
    b`` counts as importing ``a.b`` when that is a module, else ``a``."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("weknora_nb")}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            if not mod.startswith("weknora_nb"):
                continue
            for a in node.names:
                out.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod)
    return out - {_module(path)}


def test_no_import_circle():
    known = {_module(p) for p in SOURCES}
    graph = {_module(p): {m for m in _imported_modules(p, known) if m in known} for p in SOURCES}
    circles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    counter = [0]

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)
