"""Optional parts: a command that needs an extra that is not installed names it and exits 2, before any work."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from weknora_nb.core import extras
from weknora_nb.core.extras import MissingExtra, require

#: a Python program that runs the command line with the sandbox's BM25 package absent, as in an install without
#: the extra (the import system is told the package does not exist)
WITHOUT_BM25 = textwrap.dedent("""\
    import importlib.abc, sys
    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "bm25s" or name.startswith("bm25s."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, Absent())
    from weknora_nb.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("argv, what", [(["demo", "--out", "never"], "weknora-nb demo"),
                                        (["sandbox", "versions"], "weknora-nb sandbox versions"),
                                        (["sandbox", "build"], "weknora-nb sandbox build")])
def test_a_command_without_its_extra_names_it_and_exits_2(tmp_path, argv, what):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_BM25, *argv], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {what} needs the sandbox extra: pip install 'weknora-nb[sandbox]' "
                           "(not installed: bm25s)\n")
    assert not (tmp_path / "never").exists()


def test_the_sandbox_names_its_extra_when_used_without_it():
    code = WITHOUT_BM25.replace("from weknora_nb.cli import main\nraise SystemExit(main(sys.argv[1:]))\n",
                                "import weknora_nb.sandbox as s\ns.load_versions\ns.SandboxServer\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    said = "MissingExtra: weknora_nb.sandbox.SandboxServer needs the sandbox extra"
    assert proc.returncode == 1 and said in proc.stderr


def test_require_passes_when_every_module_is_there_and_lists_what_is_missing(monkeypatch):
    require("sandbox", "the demo")   # the test environment has every extra
    monkeypatch.setitem(extras.EXTRAS, "sandbox", ("bm25s", "no_such_module_1", "no_such_module_2"))
    with pytest.raises(MissingExtra, match=r"not installed: no_such_module_1, no_such_module_2\)$"):
        require("sandbox", "the demo")
