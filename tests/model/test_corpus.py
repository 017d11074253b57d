"""Corpora, tokenisation into sequences, and the train/eval split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from causaldim.errors import UsageError
from causaldim.model.corpus import Corpus, builtin_corpus, leading_bos, load_corpus, split, tokenize
from causaldim.model.load import load_tokenizer, resolve_model


def test_builtin_corpus_is_deterministic_and_large():
    first, again = builtin_corpus(), builtin_corpus()  # the second comes from the cache
    assert first.sha256 == again.sha256 and first.texts == again.texts
    assert first.id.startswith("builtin:stdlib-docstrings:python-3.")
    assert len(first.texts) > 3000 and first.n_chars > 1_000_000  # several hundred k tokens
    assert any("Return" in t for t in first.texts[:200])


def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("CAUSALDIM_CACHE", str(tmp_path))
    reference = builtin_corpus()
    (cached,) = tmp_path.glob("corpus-*.json")
    cached.write_text("{not json")
    assert builtin_corpus().sha256 == reference.sha256
    # Altered but still valid JSON: the seal catches it, and the texts are rebuilt.
    obj = json.loads(cached.read_text())
    obj["texts"][0] = "an edited docstring"
    cached.write_text(json.dumps(obj))
    assert builtin_corpus().sha256 == reference.sha256


def test_file_folder_and_jsonl_corpora(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.txt").write_text("second document")
    (tmp_path / "docs" / "a.txt").write_text("first document")
    folder = load_corpus(str(tmp_path / "docs"))
    assert folder.texts == ["first document", "second document"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"body": f"row {i}"}) for i in range(3)) + "\n\n")
    assert load_corpus(str(rows), "body").texts == ["row 0", "row 1", "row 2"]
    single = tmp_path / "one.txt"
    single.write_text("just this")
    assert load_corpus(str(single)).texts == ["just this"]
    assert load_corpus(str(single)).sha256 != folder.sha256


def test_hf_dataset_folder_needs_datasets_or_reads_it(tmp_path):
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "dataset_info.json").write_text("{}")
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match="pip install datasets"):
            load_corpus(str(folder))
    else:
        datasets.Dataset.from_dict({"text": ["a b c", "d e f"]}).save_to_disk(str(folder))
        assert load_corpus(str(folder)).texts == ["a b c", "d e f"]


def test_tokenize_packs_documents_with_end_of_text(tiny_model, text_corpus):
    tok = load_tokenizer(resolve_model(tiny_model("llama")))
    corpus = load_corpus(str(text_corpus))
    seqs = tokenize(corpus, tok, 64)
    flat = tok(corpus.texts[0], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert seqs.shape[1] == 64 and seqs.dtype == torch.int64
    assert seqs.flatten().tolist() == flat[: seqs.numel()]
    assert len(flat) - seqs.numel() < 64  # only the tail that fills no row is dropped


def test_a_tokenizer_that_opens_texts_with_bos_gets_it_at_every_row():
    """Gemma's tokenizer puts <bos> before every text and the model was trained with it at
    position 0: each packed row opens with it, the documents filling the rest."""

    class Opening:  # a tokenizer that adds BOS by default, as GemmaTokenizer does
        bos_token_id, eos_token_id = 2, 1

        def __call__(self, texts, add_special_tokens=True):
            one = isinstance(texts, str)
            rows = [[10 + len(w) for w in t.split()] for t in ([texts] if one else texts)]
            rows = [[2, *r] if add_special_tokens else r for r in rows]
            return {"input_ids": rows[0] if one else rows}

    assert leading_bos(Opening()) == 2
    corpus = Corpus("x", ["a bb ccc dddd", "eeeee ff g"], "sha")
    rows = tokenize(corpus, Opening(), 4)
    assert rows[:, 0].eq(2).all()
    assert rows[:, 1:].flatten().tolist() == [11, 12, 13, 14, 1, 15, 12, 11, 1][:9]
    closed = Opening()
    closed.bos_token_id = None
    assert leading_bos(closed) is None


@settings(max_examples=40, deadline=None)
@given(
    n_seq=st.integers(2, 60),
    tokens=st.integers(1, 4000),
    frac=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31),
)
def test_split_is_disjoint_deterministic_and_sized(n_seq, tokens, frac, seed):
    seqs = torch.arange(n_seq * 8).view(n_seq, 8)  # every row distinct
    a, b = split(seqs, tokens, frac, seed), split(seqs, tokens, frac, seed)
    assert torch.equal(a.train, b.train) and torch.equal(a.eval, b.eval)
    assert len(a.eval) >= 1 and len(a.train) >= 1
    assert len(a.train) + len(a.eval) == min(n_seq, max(tokens // 8, 2))
    rows = {tuple(r) for r in a.train.tolist()} | {tuple(r) for r in a.eval.tolist()}
    assert len(rows) == len(a.train) + len(a.eval)  # no sequence in both splits


def test_split_needs_two_sequences():
    with pytest.raises(UsageError, match="at least 2 are needed"):
        split(torch.zeros(1, 8, dtype=torch.long), 100, 0.5, 0)


def test_a_corpus_that_is_not_text_is_refused(tmp_path):
    import sys

    binary = tmp_path / "python.bin"
    binary.write_bytes(Path(sys.executable).resolve().read_bytes()[:300_000])  # an ELF
    with pytest.raises(UsageError, match="is not text: .*undecodable bytes or control"):
        load_corpus(str(binary))
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("Plain prose, with a few accents: café, naïve.\n" * 50)
    (folder / "b.txt").write_bytes(bytes(range(256)) * 40)
    with pytest.raises(UsageError, match="b.txt is not text"):
        load_corpus(str(folder))
    assert load_corpus(str(folder / "a.txt")).texts  # accented UTF-8 text passes
