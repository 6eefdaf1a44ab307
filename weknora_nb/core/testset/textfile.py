"""Text files read as a stream of numbered lines (JSONL, CSV, TREC qrels and topics), a block of bytes at a time.

Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (nothing else: a U+2028 inside a JSON string is text); a BOM
opening the file is tolerated. A line that is not valid UTF-8 is a problem naming its line and byte
offset. A file that cannot be read is a :class:`~weknora_nb.core.errors.TestSetError` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from weknora_nb.core.errors import Problem, TestSetError, reading

BOM = b"\xef\xbb\xbf"
#: bytes of lines read at a time
BLOCK_BYTES = 1 << 21


def raw_blocks(path: Path) -> Iterator[list[bytes]]:
    """The binary lines of a file (each ending at ``\\n``), about :data:`BLOCK_BYTES` at a time."""
    with reading(path, TestSetError), open(path, "rb") as fh:
        while block := fh.readlines(BLOCK_BYTES):
            yield block


class Decoder:
    """Binary lines to (1-based line number, text), numbering lines and counting bytes across calls.

    A line that is not valid UTF-8 becomes a problem naming it and is skipped (``stop_at_bad``: ends the
    file, :attr:`stopped`).
    """

    def __init__(self, path: Path, problems: list[Problem]):
        self.path, self.problems = str(path), problems
        self.lineno = self.offset = 0   # lines and bytes read so far
        self.stopped = False

    def skip(self, block: list[bytes]) -> None:
        """Count ``block`` as read elsewhere (its lines hold no lone ``\\r``: one line per item)."""
        self.lineno += len(block)
        self.offset += sum(map(len, block))

    def lines(self, block: Iterable[bytes], *, keepends: bool = False,
              stop_at_bad: bool = False) -> Iterator[tuple[int, str]]:
        for raw in block:
            single = b"\r" not in raw or (raw.endswith(b"\r\n") and raw.count(b"\r") == 1)
            for piece in [raw] if single else _split_cr(raw):
                self.lineno += 1
                start = 3 if self.lineno == 1 and piece.startswith(BOM) else 0
                try:
                    text = piece[start:].decode("utf-8")
                except UnicodeDecodeError as exc:
                    self.problems.append(Problem(self.path, self.lineno, None,
                                                 f"not valid UTF-8 (byte offset {self.offset + start + exc.start})"))
                    if stop_at_bad:
                        self.stopped = True
                        return
                    self.offset += len(piece)
                    continue
                self.offset += len(piece)
                yield self.lineno, (text if keepends else text.rstrip("\r\n"))


def read_lines(path: Path, problems: list[Problem], *, keepends: bool = False,
               stop_at_bad: bool = False) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, line) of a UTF-8 file, read as a stream (see :class:`Decoder`)."""
    decoder = Decoder(path, problems)
    for block in raw_blocks(path):
        yield from decoder.lines(block, keepends=keepends, stop_at_bad=stop_at_bad)
        if decoder.stopped:
            return


def _split_cr(raw: bytes) -> list[bytes]:
    """A binary line cut after every ``\\r`` that no ``\\n`` follows (old Mac line ends)."""
    return [p for p in re.split(rb"(?<=\r)(?!\n)", raw) if p]
