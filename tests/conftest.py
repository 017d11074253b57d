"""Shared fixtures: offline hub, a private cache, seeding, tiny random-init models, the
smoke run of the embedded model; the suite on two xdist workers by default (one torch
thread each; a file, or a group of files sharing a fixture, on one worker)."""

from __future__ import annotations

import os
import random

os.environ["HF_HUB_OFFLINE"] = "1"  # tests never download
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

# Under pytest-xdist each worker computes with one torch thread: two workers with a thread
# per core each, on two cores, wait on each other at every parallel region.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

WORKERS = 2  # `pytest` alone, where pytest-xdist is installed and two cores are usable
# Files whose tests share a session fixture, run on one worker. The rest: one worker a file.
GROUPS = {
    "tests/test_embedded.py": "embedded model",  # smoke_run: the smoke preset, run once
    "tests/test_executors.py": "embedded model",
    "tests/test_notebook.py": "embedded model",
}
# The groups that take longest, started first so that no worker is left with one at the
# end (measured with --durations=0 on 2 workers); the others follow in collection order.
FIRST = ["embedded model", "tests/test_pipeline.py", "tests/test_integrity.py"]


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return GROUPS.get(path, path)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`pytest` alone runs on two xdist workers, as `-n 2 --dist loadfile` with GROUPS and
    FIRST; `-n N` or `--dist` says otherwise, and `-n 0` or `-p no:xdist` runs serially.
    Set here, not in addopts, where `-n` would break `-p no:xdist`."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    opt = config.option
    if opt.numprocesses is not None or opt.dist != "no" or opt.usepdb or opt.collectonly:
        return
    if _usable_cores() >= WORKERS:
        opt.numprocesses, opt.dist = WORKERS, "loadfile"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the files of a group in one unit of work and the units in
    collection order (FIRST first, as the workers order their items). Not --dist loadgroup
    with xdist_group marks: on pytest 9.2 its groups are silently ignored (pytest-xdist
    issue 1386)."""
    if config.option.dist != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    config.option.loadscopereorder = False  # not by number of tests: FIRST decides
    return GroupedFiles(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Tell each worker the distribution mode: a worker parses the command line as typed,
    not the options that pytest_cmdline_main set."""
    node.workerinput["dist"] = node.config.option.dist


def pytest_collection_modifyitems(config, items):
    """On a worker of --dist loadfile, FIRST's groups first (a stable sort: the order
    within a group, and a serial run's order, unchanged)."""
    if getattr(config, "workerinput", {}).get("dist") == "loadfile":
        rank = {group: i for i, group in enumerate(FIRST)}
        items.sort(key=lambda item: rank.get(_group(item.nodeid), len(FIRST)))


WORDS = [
    "the",
    "model",
    "reads",
    "a",
    "token",
    "and",
    "writes",
    "a",
    "vector",
    "into",
    "the",
    "residual",
    "stream",
    "while",
    "each",
    "layer",
    "adds",
    "its",
    "update",
    "so",
    "that",
    "later",
    "layers",
    "can",
    "find",
    "what",
    "earlier",
    "ones",
    "wrote",
    "and",
    "the",
    "output",
    "depends",
    "on",
    "few",
    "of",
    "the",
    "many",
    "directions",
    "that",
    "the",
    "stream",
    "holds",
]


@pytest.fixture(autouse=True)
def seeded():
    """Every test starts from the same random state."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def one_thread_a_worker():
    """Under xdist a run computes with one thread by default, not one per usable core
    (causaldim.threads.choose): two workers with two threads each on two cores wait on each
    other (measured: the suite took nearly twice as long). An explicit --threads/threads= is kept.
    For the whole session, so that the runs of module and session fixtures use it too.
    Yields the real choose (None when not a worker)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield None
        return
    from causaldim import threads

    choose = threads.choose

    def one_by_default(requested=None):
        return choose(requested) if requested is not None else choose()._replace(threads=1)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threads, "choose", one_by_default)
        yield choose


@pytest.fixture(autouse=True)
def threads_as_shipped(request, one_thread_a_worker, monkeypatch):
    """tests/test_threads.py checks the default count itself: there choose is the real one."""
    if one_thread_a_worker is not None and request.path.name == "test_threads.py":
        from causaldim import threads

        monkeypatch.setattr(threads, "choose", one_thread_a_worker)


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    os.environ["CAUSALDIM_CACHE"] = str(tmp_path_factory.mktemp("cache"))


def make_text(n_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(n_words)]
    for i in range(12, n_words, 13):
        words[i] += "."
    return " ".join(words)


@pytest.fixture(scope="session")
def text_corpus(tmp_path_factory):
    """A .txt corpus of about 12k words."""
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(make_text(12_000))
    return path


def _tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([make_text(2000, seed) for seed in range(5)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return fast


def tiny_config(family: str, n_layers: int = 4, d: int = 32, context: int = 256):
    import transformers as tf

    common = dict(vocab_size=320, bos_token_id=0, eos_token_id=0)
    llama_like = dict(
        num_hidden_layers=n_layers,
        hidden_size=d,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * d,
        max_position_embeddings=context,
        **common,
    )
    if family == "llama":
        return tf.LlamaConfig(**llama_like)
    if family == "qwen2":
        return tf.Qwen2Config(**llama_like)
    if family == "gemma2":
        return tf.Gemma2Config(head_dim=d // 4, **llama_like)
    if family == "gemma3":  # the second embedded model's family: sliding and global layers
        return tf.Gemma3TextConfig(head_dim=d // 4, sliding_window=8, **llama_like)
    if family == "phi":  # a family causaldim does not know
        return tf.PhiConfig(**{k: v for k, v in llama_like.items() if k != "num_key_value_heads"})
    if family == "gpt2":
        return tf.GPT2Config(n_layer=n_layers, n_embd=d, n_head=4, n_positions=context, **common)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(
            num_hidden_layers=n_layers,
            hidden_size=d,
            num_attention_heads=4,
            intermediate_size=2 * d,
            max_position_embeddings=context,
            **common,
        )
    raise ValueError(family)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: a saved tiny random-init model folder (with a tokenizer) per family and
    size."""
    made: dict[tuple, str] = {}

    def build(family: str = "llama", n_layers: int = 4, d: int = 32) -> str:
        key = (family, n_layers, d)
        if key not in made:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging

            # Saving draws a progress bar on stderr, which a test that builds its model
            # inside its capture would read as output of the command under test.
            logging.disable_progress_bar()
            folder = tmp_path_factory.mktemp(f"tiny-{family}-{n_layers}x{d}")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(tiny_config(family, n_layers, d))
            model.save_pretrained(folder)
            _tokenizer(folder)
            made[key] = str(folder)
        return made[key]

    return build


@pytest.fixture(scope="session")
def tiny_harvest(tiny_model, text_corpus):
    """Factory: the config of a small harvest of the tiny Llama on the text corpus into
    out, overridable."""
    from causaldim.config import HarvestConfig

    def make(out, **overrides) -> HarvestConfig:
        base = dict(
            model=tiny_model("llama"),
            corpus=str(text_corpus),
            tokens=2048,
            seq_len=32,
            batch_size=4,
            shard_tokens=256,
            eval_fraction=0.25,
            out=str(out),
        )
        return HarvestConfig(**{**base, **overrides})

    return make


@pytest.fixture
def harvest_config(tmp_path, tiny_harvest):
    """Factory: tiny_harvest, by default into this test's folder."""

    def make(out=None, **overrides):
        return tiny_harvest(out or tmp_path / "run", **overrides)

    return make


@pytest.fixture(scope="session")
def tiny_lm_store(tmp_path_factory, tiny_harvest):
    """Factory: the tiny Llama loaded, and a small store of it without probes (for
    ablations), one per token count."""
    from causaldim.harvest import harvest
    from causaldim.model.load import load_model, resolve_model

    def make(tokens: int):
        cfg = tiny_harvest(
            tmp_path_factory.mktemp(f"lm-store-{tokens}"),
            tokens=tokens,
            shard_tokens=16_384,
            logit_probes=0,
            fisher_probes=0,
        )
        store = harvest(cfg, progress=False).store
        return load_model(resolve_model(cfg.model)), store

    return make


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke preset on the embedded model, run once a session (about a minute): its
    folder and its results.json as first written. A test that runs in it again works on a
    copy; one that runs the preset elsewhere may seed its folder with this store."""
    import json

    from causaldim import cli

    out = tmp_path_factory.mktemp("smoke") / "run"
    assert cli.main(["--quiet", "run", "--preset", "smoke", "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def seed_store(run, out) -> None:
    """Put the stores of a finished run into the folder `out` of a run of the same harvest,
    which then reuses them instead of harvesting again."""
    import shutil
    from pathlib import Path

    shutil.copytree(Path(run) / "stores", Path(out) / "stores")


def snapshot(root):
    """Every file under root with its modification time: what a refused command must
    leave as it found it."""
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getmtime(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


@pytest.fixture
def no_model_work(monkeypatch):
    """Loading weights during a bad-input test is a failure in itself: every module that
    loads a model is patched (imported first, so that none binds the patch for good)."""
    from causaldim import pipeline
    from causaldim.harvest import write as harvest_mod
    from causaldim.model import load as models

    def forbidden(*a, **k):
        raise AssertionError("weights were loaded before the input was checked")

    for module in (harvest_mod, models, pipeline):
        monkeypatch.setattr(module, "load_model", forbidden)


def hub_http_error(cls, message: str = "refused", status: int = 403):
    """A huggingface_hub HTTP error (GatedRepoError, RepositoryNotFoundError, ...) as its
    client raises it, on a response made with the client's own HTTP library."""
    import importlib

    from huggingface_hub import errors

    http = importlib.import_module(errors.Response.__module__.split(".")[0])
    response = http.Response(status, request=http.Request("GET", "https://huggingface.co/x"))
    return cls(message, response=response)


def gemma_scope_npz(path, d: int, m: int, seed: int = 0) -> str:
    """A params.npz laid out as Gemma Scope's (JumpReLU, no b_dec subtracted): unit decoder
    rows, the encoder their transpose, every threshold 0.05. Returns its path."""
    from pathlib import Path

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, d)).astype(np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        W_enc=w.T.copy(),
        W_dec=w,
        b_enc=np.zeros(m, np.float32),
        b_dec=np.zeros(d, np.float32),
        threshold=np.full(m, 0.05, np.float32),
    )
    return str(path)
