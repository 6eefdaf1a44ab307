"""The package's layers: every import inside weknora_nb points down (or stays in its own layer).

::

    5  __main__
    4  cli, __init__
    3  demo
    2  reports
    1  analysis   collect   sandbox      (side by side: none imports another)
    0  core, _version
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "weknora_nb"
RANK = {"_version": 0, "core": 0, "analysis": 1, "collect": 1, "sandbox": 1, "reports": 2, "demo": 3,
        "cli": 4, "__init__": 4, "__main__": 5}


def _layer(module: str) -> str:
    """``weknora_nb.core.scoring`` -> ``core``; ``weknora_nb`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every weknora_nb import in ``path``, wherever it stands."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    here = list(rel.parts[:-1])  # the package a relative import starts from
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "weknora_nb"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "weknora_nb":
                continue
            if mod == "weknora_nb":  # from weknora_nb import x: x may be a layer
                out += [(node.lineno, f"weknora_nb.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_in_a_layer():
    layers = {_layer(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)) for p in MODULES}
    assert layers <= set(RANK), f"modules outside every layer: {sorted(layers - set(RANK))}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path):
    mine = _layer(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    wrong = []
    for line, mod in _imports(path):
        theirs = _layer(mod)
        if theirs not in RANK:
            continue  # a public name of weknora_nb/__init__, e.g. __version__
        if theirs != mine and RANK[theirs] >= RANK[mine]:
            wrong.append(f"line {line}: {mine} imports {mod} ({theirs} is not below {mine})")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path):
    """The rule above can fail: a core module importing the analysis layer is caught."""
    bad = PACKAGE / "core" / "_layers_probe.py"
    bad.write_text("from weknora_nb.analysis import stats\n", encoding="utf-8")
    try:
        assert _imports(bad) == [(1, "weknora_nb.analysis")]
        with pytest.raises(AssertionError, match="core imports weknora_nb.analysis"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()
