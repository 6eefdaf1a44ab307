"""Personal data out of query texts before anything is stored (``weknora-nb testset sample``).

:func:`mask` replaces, in this order (a span taken by one kind is never looked at again):

- ``<EMAIL>``: an e-mail address (``local@domain.tld``, ASCII);
- ``<ID>``: an 18-character resident ID card number (GB 11643-1999): a region code starting 1-9, a
  birth date that exists (years 1900-2099), a sequence number and a check character that the
  weighted sum mod 11 gives (``10X98765432``); an 18-digit number whose check digit is wrong is
  not an ID (it may still be a card number, below);
- ``<CARD>``: a bank card number of 16 to 19 digits, written whole or in groups of four separated
  by one space or hyphen, that passes the Luhn check;
- ``<PHONE>``: a mainland mobile number ``1[3-9]`` + 9 digits, optionally after ``+86`` / ``0086`` /
  ``86`` and written 3-4-4 with spaces or hyphens.

A number is matched whole: never as a part of a longer run of digits (so an ID card number holds
no phone number). Full-width digits, letters and ``@ . - + _`` count as their ASCII forms (users
type ``１３８...`` too); the rest of the text is kept exactly as written. The counts per kind say
how many spans were replaced. Nothing here logs a text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date

#: the kinds of personal data, in the order they are looked for
KINDS = ("email", "id", "card", "phone")
PLACEHOLDERS = {"email": "<EMAIL>", "id": "<ID>", "card": "<CARD>", "phone": "<PHONE>"}

#: full-width ASCII (U+FF01-U+FF5E) and the ideographic space read as ASCII: one character for one
_WIDTH = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}

_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
                    r"(?![A-Za-z0-9])")
_ID = re.compile(r"(?<![0-9])[1-9][0-9]{16}[0-9Xx](?![0-9A-Za-z])")
_CARD = re.compile(r"(?<![0-9])(?:[0-9]{16,19}|[0-9]{4}(?:[ -][0-9]{4}){3}(?:[ -][0-9]{1,3})?)(?![0-9])")
_PHONE = re.compile(r"(?<![0-9+])(?:(?:\+|00)?86[ -]?)?1[3-9][0-9](?:[ -]?[0-9]{4}){2}(?![0-9])")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


@dataclass(frozen=True)
class Masked:
    """A text with its personal data replaced, and how many spans of each kind were."""

    text: str
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def masked(self) -> bool:
        """Whether anything was replaced."""
        return sum(self.counts.values()) > 0


def id_card_ok(number: str) -> bool:
    """Whether ``number`` is an 18-character ID card number with a real birth date and the right check character."""
    if len(number) != 18 or not number[:17].isdigit() or number[0] == "0":
        return False
    try:
        born = date(int(number[6:10]), int(number[10:12]), int(number[12:14]))
    except ValueError:
        return False
    if not 1900 <= born.year <= 2099:
        return False
    total = sum(int(d) * w for d, w in zip(number[:17], _ID_WEIGHTS, strict=True))
    return "10X98765432"[total % 11] == number[17].upper()


def luhn_ok(digits: str) -> bool:
    """Whether the digit string ``digits`` passes the Luhn check (every second digit from the right doubled)."""
    if not digits.isdigit():
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _card_span(folded: str, m: re.Match[str]) -> tuple[int, int] | None:
    """The span of a Luhn-valid card number in match ``m`` (a trailing short group dropped if need be), or None."""
    start, end = m.span()
    for stop in (end, folded.rfind(" ", start, end), folded.rfind("-", start, end)):
        if stop <= start:
            continue
        digits = re.sub(r"[ -]", "", folded[start:stop])
        if 16 <= len(digits) <= 19 and luhn_ok(digits):
            return start, stop
    return None


def _spans(folded: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every piece of personal data in the width-folded text, non-overlapping."""
    taken: list[tuple[int, int, str]] = []

    def free(a: int, b: int) -> bool:
        return all(b <= s or a >= e for s, e, _ in taken)
    for m in _EMAIL.finditer(folded):
        taken.append((*m.span(), "email"))
    for m in _ID.finditer(folded):
        if free(*m.span()) and id_card_ok(m.group()):
            taken.append((*m.span(), "id"))
    for m in _CARD.finditer(folded):
        span = _card_span(folded, m)
        if span is not None and free(*span):
            taken.append((*span, "card"))
    for m in _PHONE.finditer(folded):
        if free(*m.span()):
            taken.append((*m.span(), "phone"))
    return sorted(taken)


def mask(text: str) -> Masked:
    """``text`` with each e-mail address, ID card number, bank card number and mobile number replaced by
    ``<EMAIL>``, ``<ID>``, ``<CARD>``, ``<PHONE>`` (see the module docstring), and the counts per kind."""
    folded = text.translate(_WIDTH)
    spans = _spans(folded)
    if not spans:
        return Masked(text)
    out, last = [], 0
    counts: Counter[str] = Counter()
    for start, end, kind in spans:
        out += [text[last:start], PLACEHOLDERS[kind]]
        counts[kind] += 1
        last = end
    out.append(text[last:])
    return Masked("".join(out), counts)
