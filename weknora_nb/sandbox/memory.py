"""What the sandbox remembers: values by key, the least recently used forgotten past a size.

The server keeps its search answers this way (:data:`weknora_nb.sandbox.server.SEARCH_CACHE_SIZE` response
bodies), the engine the hits of its knowledge-searches (:data:`weknora_nb.sandbox.engine.SEARCH_MEMORY`). Both
live on one server's event loop: no lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class AnswerMemory(Generic[V]):
    """Values by key; the least recently used goes past ``size``."""

    def __init__(self, size: int):
        self.size = size
        self._values: OrderedDict[Hashable, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Hashable]:
        """The keys remembered, the least recently used first."""
        return iter(list(self._values))

    def get(self, key: Hashable) -> V | None:
        """The remembered value (now the most recently used), or None."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def keep(self, key: Hashable, value: V) -> None:
        """Remember ``value`` for ``key``, forgetting the least recently used past ``size``."""
        self._values[key] = value
        if len(self._values) > self.size:
            self._values.popitem(last=False)
