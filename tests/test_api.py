"""The package's public surface."""

import weknora_nb


def test_all_lists_exactly_the_public_names():
    public = {n for n in dir(weknora_nb) if not n.startswith("_") and not isinstance(getattr(weknora_nb, n),
                                                                                      type(weknora_nb))}
    assert set(weknora_nb.__all__) - {"__version__"} == public
