"""Which WeKnora release the sandbox behaves as (``--weknora-version``), as data.

Each field is one behaviour that differs between releases, with the fact of
``docs/weknora-contract.md`` that holds it. The default is the latest release.
"""

from __future__ import annotations

from dataclasses import dataclass

from weknora_nb.core.errors import UsageError

__all__ = ["WeKnoraRelease", "RELEASES", "DEFAULT_RELEASE", "release"]


@dataclass(frozen=True)
class WeKnoraRelease:
    """The behaviours of one WeKnora release the sandbox emulates."""

    name: str
    #: C15: methods routed for hybrid-search (v0.6.2: GET only, with a JSON body)
    hybrid_search_methods: tuple[str, ...] = ("GET", "POST")
    #: C17: what ``match_count <= 0`` does: "empty" (0 -> data null, negative -> panic 500) or "default" (50)
    match_count_nonpositive: str = "empty"
    #: C39: ``metadata.model_score`` present on reranked knowledge-search results
    model_score_metadata: bool = True
    #: C38: the final score also carries the +-5 % position factor
    position_factor: bool = False
    #: C43: FILTER_TOP_K sorts the merged results by score first
    sort_before_top_k: bool = True
    #: C53: chunk listings return HTML-escaped content
    escape_chunk_listing: bool = False
    #: C3-C7: API keys from a key service (platform keys, X-Tenant-ID, capabilities)
    key_service: bool = True
    #: C65: the server writes inline ``<kb ... />`` citations into answers
    inline_citations: bool = True
    #: C64: the references event comes before the answer
    references_first: bool = True


RELEASES: dict[str, WeKnoraRelease] = {
    "v0.6.2": WeKnoraRelease("v0.6.2", hybrid_search_methods=("GET",), model_score_metadata=False,
                             position_factor=True, sort_before_top_k=False, escape_chunk_listing=True,
                             key_service=False, inline_citations=False, references_first=False),
    "v0.6.3": WeKnoraRelease("v0.6.3", position_factor=True, sort_before_top_k=False, escape_chunk_listing=True,
                             key_service=False, inline_citations=False),
    "v0.7.2": WeKnoraRelease("v0.7.2"),
    "main": WeKnoraRelease("main", match_count_nonpositive="default"),
}
#: the latest release
DEFAULT_RELEASE = "v0.7.2"


def release(name: str | None) -> WeKnoraRelease:
    """The release called ``name`` (None: the default); a UsageError lists the ones emulated."""
    key = DEFAULT_RELEASE if name is None else name
    if key not in RELEASES:
        raise UsageError(argument="--weknora-version", allowed=list(RELEASES), got=name)
    return RELEASES[key]
