"""Hub datasets as --corpus: recognised by name, resolved to a commit, streamed only up to
the token budget, cached, recorded; every failure one line before any weights load.
Nothing here reaches the network: the two hub seams of the corpus module are stood in
for by local jsonl files streamed with the real datasets library."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import hub_http_error, make_text, snapshot

from causaldim import cli
from causaldim.errors import UsageError
from causaldim.model import hub_corpus as corpus_mod
from causaldim.model.corpus import budget_tokens, load_corpus, split, tokenize
from causaldim.model.hub_corpus import corpus_for, is_hub_name
from causaldim.model.load import load_tokenizer, resolve_model

datasets = pytest.importorskip("datasets")
httpx2 = pytest.importorskip("httpx2")
hub_errors = pytest.importorskip("huggingface_hub.errors")

SHA = "0123456789abcdef0123456789abcdef01234567"
N_ROWS = 300


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    """A few hundred short documents in three jsonl files (a dataset's train split)."""
    folder = tmp_path_factory.mktemp("hub-dataset")
    files = []
    for part in range(3):
        path = folder / f"train-{part}.jsonl"
        rows = [
            {"text": make_text(8 + (i * 7) % 30, seed=i), "id": i}
            for i in range(part * N_ROWS // 3, (part + 1) * N_ROWS // 3)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(str(path))
    return files


class FakeHub:
    """What the seams saw and what they are to do: a commit sha to resolve to, or an
    error to raise when resolving or when streaming."""

    def __init__(self, files):
        self.files = files
        self.sha = SHA
        self.info_error: BaseException | None = None
        self.stream_error: BaseException | None = None
        self.info_calls: list[tuple] = []
        self.streams: list[tuple] = []
        self.consumed = 0  # rows read from the stream, in all

    def info(self, name, revision):
        self.info_calls.append((name, revision))
        if self.info_error is not None:
            raise self.info_error
        if revision not in (None, "main", "v1", self.sha):
            raise hub_http_error(hub_errors.RevisionNotFoundError, "404 Client Error", 404)
        return self.sha

    def stream(self, name, config, split, revision):
        self.streams.append((name, config, split, revision))
        if self.stream_error is not None:
            raise self.stream_error
        assert revision == self.sha  # the resolved commit is what streams
        ds = datasets.load_dataset(
            "json", data_files={"train": self.files}, split=split, streaming=True
        )

        def rows():
            for row in ds:
                self.consumed += 1
                yield row

        return rows()


@pytest.fixture
def hub(monkeypatch, tmp_path, hub_files):
    fake = FakeHub(hub_files)
    monkeypatch.setattr(corpus_mod, "_hub_info", fake.info)
    monkeypatch.setattr(corpus_mod, "_hub_stream", fake.stream)
    monkeypatch.setenv("CAUSALDIM_CACHE", str(tmp_path / "cache"))  # this test's own
    return fake


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(resolve_model(tiny_model("llama")))


def test_hub_names_are_recognised_and_local_paths_win(tmp_path, monkeypatch, text_corpus, tok):
    for name in ("NeelNanda/pile-10k", "HuggingFaceFW/fineweb", "wikitext", "org/set-1.0"):
        assert is_hub_name(name), name
    for spec in ("builtin", "data.jsonl", "texts/a.txt", "a/b/c", "./x", "/abs/x", "~/x", ""):
        assert not is_hub_name(spec), spec
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "name").mkdir()
    (tmp_path / "owner" / "name" / "a.txt").write_text("a local document")
    assert not is_hub_name("owner/name")
    corpus, seqs = corpus_for("owner/name", tok, 4, 64)
    assert corpus.id.startswith("path:") and corpus.hub is None and "hub" not in corpus.describe()
    # A local corpus is exactly what load_corpus gives (its id and sha256 key existing stores).
    local, seqs = corpus_for(str(text_corpus), tok, 32, 64)
    assert local == load_corpus(str(text_corpus))
    assert seqs.equal(tokenize(local, tok, 32))
    with pytest.raises(UsageError, match="--corpus-config: only for a hub dataset"):
        corpus_for(str(text_corpus), tok, 32, 64, hub_config="sample-10BT")


def test_stream_stops_at_the_budget_and_is_recorded(hub, tok):
    corpus, seqs = corpus_for("owner/name", tok, 32, 250, hub_split="train")
    need = budget_tokens(32, 250)
    assert need == 256
    assert corpus.id == "hub:owner/name"
    assert corpus.describe()["hub"] == {
        "name": "owner/name",
        "config": None,
        "split": "train",
        "revision": SHA,
        "text_field": "text",
    }
    assert list(corpus.describe()) == ["id", "hub", "sha256", "n_docs", "n_chars"]
    assert hub.info_calls == [("owner/name", None)]
    assert hub.streams == [("owner/name", None, "train", SHA)]
    assert 0 < len(corpus.texts) <= hub.consumed < N_ROWS  # stopped early
    # The shortest prefix that reaches the budget, packed as tokenize packs it.
    assert seqs.equal(tokenize(corpus, tok, 32))
    assert seqs.numel() >= need
    shorter = corpus._replace(texts=corpus.texts[:-1])
    assert tokenize(shorter, tok, 1).numel() < need
    # Enough sequences for the split the run asked for.
    s = split(seqs, 250, 0.25, 0)
    assert len(s.train) + len(s.eval) == 250 // 32
    assert "split train" in corpus.label and SHA[:12] in corpus.label


def test_a_short_split_is_read_whole(hub, tok):
    corpus, seqs = corpus_for("owner/name", tok, 32, 10**7)
    assert hub.consumed == N_ROWS and len(corpus.texts) == N_ROWS
    assert seqs.equal(tokenize(corpus, tok, 32))
    again, _ = corpus_for("owner/name", tok, 32, 10**7)  # a complete copy serves any budget
    assert again == corpus and len(hub.streams) == 1


def test_a_second_load_reads_the_cache(hub, tok):
    first, seqs = corpus_for("owner/name", tok, 32, 512)
    consumed = hub.consumed
    (cached,) = corpus_mod.cache_dir().glob("hub-corpus-*.json")
    assert len(json.loads(cached.read_text())["texts"]) == len(first.texts)  # only those used
    again, seqs_again = corpus_for("owner/name", tok, 32, 512)
    assert again == first and seqs_again.equal(seqs)
    assert len(hub.streams) == 1 and hub.consumed == consumed
    # Another budget is another copy.
    corpus_for("owner/name", tok, 32, 1024)
    assert len(hub.streams) == 2


def test_a_damaged_cache_is_streamed_again(hub, tok, capsys):
    first, _ = corpus_for("owner/name", tok, 32, 512)
    (cached,) = corpus_mod.cache_dir().glob("hub-corpus-*.json")
    obj = json.loads(cached.read_text())
    obj["texts"][0] = "an edited document"
    cached.write_text(json.dumps(obj))
    again, _ = corpus_for("owner/name", tok, 32, 512)
    assert again == first and len(hub.streams) == 2
    assert "is damaged" in capsys.readouterr().err


class CoarseTokenizer:
    """Far fewer tokens per text than the tiny BPE: the same budget needs more texts."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[1] * max(1, len(t) // 40) for t in texts]}


def test_a_tokenizer_that_needs_more_text_reads_more_and_the_first_keeps_its_corpus(hub, tok):
    first, _ = corpus_for("owner/name", tok, 32, 512)
    coarse, _ = corpus_for("owner/name", CoarseTokenizer(), 32, 512)
    assert len(hub.streams) == 2 and coarse.texts[: len(first.texts)] == first.texts
    assert len(coarse.texts) > len(first.texts)
    again, _ = corpus_for("owner/name", tok, 32, 512)  # the longer copy serves it
    assert again == first and len(hub.streams) == 2  # same texts, same sha256: same store


def test_without_network_a_cached_copy_serves_a_pinned_or_offline_run(hub, tok, monkeypatch):
    first, _ = corpus_for("owner/name", tok, 32, 512, hub_revision="v1")
    hub.info_error = httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")
    calls = len(hub.info_calls)
    pinned, _ = corpus_for("owner/name", tok, 32, 512, hub_revision=SHA)  # a full sha
    assert pinned == first and len(hub.info_calls) == calls  # the hub was not even asked
    tagged, _ = corpus_for("owner/name", tok, 32, 512, hub_revision="v1")  # read at v1
    assert tagged == first and tagged.hub["revision"] == SHA
    hub.info_error = hub_errors.OfflineModeIsEnabled("offline mode is enabled")
    offline, _ = corpus_for("owner/name", tok, 32, 512)  # HF_HUB_OFFLINE=1 (conftest)
    assert offline == first
    assert len(hub.streams) == 1
    # Online in principle but unreachable, and nothing pinned: the latest commit is unknown.
    monkeypatch.setattr(corpus_mod.hf, "offline", lambda: False)
    hub.info_error = httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")
    with pytest.raises(UsageError, match="cannot be reached.*HF_HUB_OFFLINE=1"):
        corpus_for("owner/name", tok, 32, 512)
    # Settings that were never cached are not served from another's copy.
    with pytest.raises(UsageError, match="no copy of it is cached"):
        corpus_for("owner/name", tok, 32, 4096, hub_revision=SHA)


def test_the_real_seams_offline_say_the_hub_cannot_be_reached(tmp_path, monkeypatch, tok):
    """HF_HUB_OFFLINE=1 (conftest): huggingface_hub and datasets refuse to go online, and
    their errors become the one-line message."""
    monkeypatch.setenv("CAUSALDIM_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UsageError, match="cannot be reached .*OfflineModeIsEnabled"):
        corpus_for("owner/name", tok, 32, 512)
    monkeypatch.setattr(corpus_mod, "_hub_info", lambda name, revision: SHA)
    with pytest.raises(UsageError, match="cannot be reached .*ConnectionError"):
        corpus_for("owner/name", tok, 32, 512)


GATED = (
    "Dataset 'owner/name' is a gated dataset on the Hub. You must be authenticated to access it."
)


def failure_cases():
    """name: (extra args, info error, stream error, text in the message)."""
    network = "cannot be reached"
    return {
        "unknown dataset": (
            [],
            hub_http_error(hub_errors.RepositoryNotFoundError, "404 Client Error", 404),
            None,
            "nor a dataset on the Hugging Face Hub",
        ),
        "unknown dataset (datasets)": (
            [],
            None,
            datasets.exceptions.DatasetNotFoundError(
                "Dataset 'owner/name' doesn't exist on the Hub or cannot be accessed."
            ),
            "nor a dataset on the Hugging Face Hub",
        ),
        "unknown revision": (["--corpus-revision", "nope"], None, None, "has no revision 'nope'"),
        "gated": (
            [],
            hub_http_error(hub_errors.GatedRepoError, "401 Client Error", 401),
            None,
            "accept its terms",
        ),
        "gated (datasets)": (
            [],
            None,
            datasets.exceptions.DatasetNotFoundError(GATED),
            "huggingface-cli login",
        ),
        "no network": ([], httpx2.ConnectError("name resolution"), None, network),
        "no network (OSError)": ([], OSError("Network is unreachable"), None, network),
        "offline, nothing cached": ([], hub_errors.OfflineModeIsEnabled("x"), None, network),
        "unknown config": (
            ["--corpus-config", "nope"],
            None,
            ValueError("BuilderConfig 'nope' not found. Available: ['default', 'sample-10BT']"),
            "pass --corpus-config one of: default, sample-10BT",
        ),
        "config needed": (
            [],
            None,
            ValueError(
                "Config name is missing.\nPlease pick one among the available configs: "
                "['en', 'de']\nExample of usage:\n\t`load_dataset('owner/name', 'en')`"
            ),
            "has several configs; pass --corpus-config one of: en, de",
        ),
        "unknown split": (
            ["--corpus-split", "validation"],
            None,
            None,
            "has no split 'validation'; pass --corpus-split one of: train",
        ),
        "no text field": (
            ["--text-field", "body"],
            None,
            None,
            "has no string field 'body' (its columns: text, id); pass --text-field",
        ),
        "not a string field": (["--text-field", "id"], None, None, "no string field 'id'"),
        "datasets not installed": ([], None, None, "pip install 'causaldim[hub]'"),
    }


@pytest.mark.parametrize("case", list(failure_cases()))
def test_failures_are_one_line_before_any_work(
    case, hub, tiny_model, tmp_path, capsys, no_model_work, monkeypatch
):
    args, info_error, stream_error, message = failure_cases()[case]
    hub.info_error, hub.stream_error = info_error, stream_error
    if case == "datasets not installed":
        monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets fails
    out = tmp_path / "out"
    argv = ["--quiet", "run", "--model", tiny_model("llama"), "--seq-len", "32"]
    argv += ["--widths", "16", "32", "--k", "4", "--out", str(out)]
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([*argv, "--corpus", "owner/name", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err, err
    assert len(err.splitlines()) == 1 and err.startswith("causaldim: error: ")
    assert snapshot(tmp_path) == before  # nothing written, not even the cache
    assert not out.exists()


def test_dry_run_names_the_hub_corpus(hub, tiny_model, tmp_path, capsys):
    argv = ["--quiet", "run", "--dry-run", "--model", tiny_model("llama"), "--seq-len", "32"]
    argv += ["--tokens", "512", "--widths", "16", "32", "--k", "4", "--out", str(tmp_path / "o")]
    argv += ["--corpus", "owner/name", "--corpus-config", "default", "--corpus-revision", "v1"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    line = next(s for s in printed.splitlines() if s.startswith("model "))
    assert f"corpus hub:owner/name (config default, split train, revision {SHA[:12]}" in line
    assert hub.info_calls == [("owner/name", "v1")]
    assert not (tmp_path / "o").exists()


def test_harvest_records_the_hub_corpus(hub, tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--quiet", "harvest", "--model", tiny_model("llama"), "--corpus", "owner/name"]
    argv += ["--tokens", "512", "--seq-len", "32", "--batch-size", "4", "--shard-tokens", "256"]
    argv += ["--eval-fraction", "0.25", "--logit-probes", "0", "--fisher-probes", "0"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert "corpus hub:owner/name" in capsys.readouterr().out
    (manifest,) = out.glob("stores/*/manifest.json")
    m = json.loads(manifest.read_text())
    assert m["corpus"]["id"] == "hub:owner/name"
    assert m["corpus"]["hub"] == {
        "name": "owner/name",
        "config": None,
        "split": "train",
        "revision": SHA,
        "text_field": "text",
    }
    assert m["corpus"]["sha256"] == m["key"]["corpus_sha256"]
    assert 0 < m["corpus"]["n_docs"] <= hub.consumed < N_ROWS
    # The re-run reuses the store and streams nothing.
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert "reused store" in capsys.readouterr().out and len(hub.streams) == 1
