"""The package's public surface."""

import subprocess
import sys

import weknora_nb


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(weknora_nb) if not n.startswith("_")}
    assert set(weknora_nb.__all__) == public | {"__version__"}
    assert set(weknora_nb.__all__) == {*weknora_nb._EXPORTS, *weknora_nb._MODULES, "__version__"}
    for name in weknora_nb.__all__:
        assert getattr(weknora_nb, name) is not None


def test_import_is_light():
    """``import weknora_nb`` loads no HTTP, table or plotting library (the CLI starts fast)."""
    code = ("import sys, weknora_nb; heavy = {'httpx', 'pandas', 'pyarrow', 'matplotlib', 'numpy'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
