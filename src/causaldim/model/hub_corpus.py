"""Hub datasets as corpora: streamed until a run has its tokens, cached, pinned to a
commit, and each failure (unknown, gated, no such field, no network) one line that names
the fix; and corpus_for, the corpus a run reads, local or hub."""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import re
import sys
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import torch

from .. import hub as hf
from ..errors import IntegrityError, UsageError
from ..fileio import cache_dir, read_sealed_json, write_sealed_json
from .corpus import (
    Corpus,
    budget_tokens,
    digest,
    is_built_in,
    leading_bos,
    load_corpus,
    pack,
    tokenize,
)


def corpus_for(
    spec: str,
    tokenizer,
    seq_len: int,
    tokens: int,
    *,
    text_field: str = "text",
    hub_config: str | None = None,
    hub_split: str = "train",
    hub_revision: str | None = None,
) -> tuple[Corpus, torch.Tensor]:
    """The corpus a run reads and its packed sequences (see tokenize). A local corpus
    ('builtin', files, folders) is read whole, as load_corpus reads it; a hub dataset is
    streamed only until its packed tokens reach the budget (budget_tokens), and cached."""
    if not is_hub_name(spec):
        given = [
            flag
            for flag, value, default in (
                ("--corpus-config", hub_config, None),
                ("--corpus-split", hub_split, "train"),
                ("--corpus-revision", hub_revision, None),
            )
            if value != default
        ]
        if given:
            raise UsageError(
                f"{', '.join(given)}: only for a hub dataset, and --corpus {spec!r} is not one"
            )
        corpus = load_corpus(spec, text_field)
        return corpus, tokenize(corpus, tokenizer, seq_len)
    return hub_corpus(
        spec,
        tokenizer,
        seq_len,
        budget_tokens(seq_len, tokens),
        config=hub_config,
        split=hub_split,
        revision=hub_revision,
        text_field=text_field,
    )


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_FILE_SUFFIXES = {
    *(".txt", ".text", ".md", ".jsonl", ".json", ".csv", ".tsv", ".parquet", ".arrow"),
    *(".gz", ".bz2", ".xz", ".zst", ".zip", ".tar"),
}


def is_hub_name(spec: str) -> bool:
    """Whether --corpus names a hub dataset: not a built-in name, not an existing local path,
    and shaped as a hub id ('owner/name', or a bare canonical name) with no file suffix."""
    if is_built_in(spec) or Path(spec).expanduser().exists():
        return False
    return bool(_HUB_ID.fullmatch(spec)) and Path(spec).suffix.lower() not in _FILE_SUFFIXES


def _hub_info(name: str, revision: str | None) -> str:
    """The commit sha of a hub dataset at revision (default: the latest); one cheap API
    call, no data. The seam tests stand in for."""
    from huggingface_hub import HfApi

    sha = HfApi().dataset_info(name, revision=revision).sha
    assert sha is not None  # the hub names the commit of every revision it finds
    return sha


def _hub_stream(name: str, config: str | None, split: str, revision: str) -> Iterable[dict]:
    """The rows of a hub dataset's split at a commit, streamed (nothing is downloaded
    whole). The seam tests stand in for."""
    import datasets

    return datasets.load_dataset(name, config, split=split, revision=revision, streaming=True)


def hub_corpus(
    name: str,
    tokenizer,
    seq_len: int,
    n_tokens: int,
    *,
    config: str | None = None,
    split: str = "train",
    revision: str | None = None,
    text_field: str = "text",
) -> tuple[Corpus, torch.Tensor]:
    """The shortest prefix of a hub dataset's split whose documents, tokenized and packed
    with end-of-text tokens, reach n_tokens (or the whole split if it is shorter), and its
    sequences. The dataset's revision is resolved to a commit sha first (that commit is
    streamed and recorded); the texts read are cached, keyed by name, config, split, sha,
    text field and n_tokens, so that a re-run streams nothing. Without the network, a
    cached copy serves a pinned --corpus-revision, or any revision under HF_HUB_OFFLINE=1.
    UsageError, in one line naming the fix, for every failure a user can meet."""
    where: dict[str, Any] = dict(name=name, config=config, split=split, text_field=text_field)
    base = _cache_base(n_tokens, **where)
    cached, offline = None, False
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):  # pinned: the hub is not asked
        cached = _read_cache(_cache_file(base, revision))
    if cached is None:
        try:
            sha = _hub_info(name, revision)
        except Exception as exc:
            if not hf.is_network_error(exc):
                error = _hub_error(exc, **where, revision=revision)
                if error is None:
                    raise
                raise error from exc
            cached, offline = _offline_cache(base, revision), True
            if cached is None:
                raise _no_network(exc, name, revision) from exc
            print(
                f"causaldim: note: the Hugging Face Hub cannot be reached; using the cached "
                f"copy of {name} at revision {cached['hub']['revision']}",
                file=sys.stderr,
            )
        else:
            cached = _read_cache(_cache_file(base, sha))
    if cached is not None:
        texts, docs, reached = _take(cached["texts"], tokenizer, n_tokens)
        if reached or cached.get("complete"):
            return _hub_result(cached["hub"], texts, docs, seq_len, leading_bos(tokenizer))
        if offline:
            raise UsageError(
                f"the Hugging Face Hub cannot be reached, and the cached copy of {name} is "
                f"too short for this model's tokenizer ({n_tokens:,} tokens needed); go "
                "online once, or pass fewer --tokens, or a local file or folder as --corpus"
            )
        sha = cached["hub"]["revision"]  # a copy too short for this tokenizer: read more
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise UsageError(
            f"streaming the hub dataset {name} needs the datasets package: "
            "pip install 'causaldim[hub]'"
        ) from None
    hub = {
        "name": name,
        "config": config,
        "split": split,
        "revision": sha,
        "text_field": text_field,
    }
    rows = _hub_texts(hub, n_tokens)
    try:
        texts, docs, reached = _take(rows, tokenizer, n_tokens)
    finally:
        rows.close()
    if not texts:
        raise UsageError(
            f"dataset {name} (split {split}) holds no text in its field {text_field!r}; "
            "pass another --corpus-split or --text-field"
        )
    record = {"id": f"hub:{name}", "hub": hub, "requested_revision": revision}
    try:
        write_sealed_json(
            _cache_file(base, sha),
            {**record, "n_tokens": n_tokens, "complete": not reached, "texts": texts},
        )
    except OSError:
        pass  # a read-only cache only costs time
    return _hub_result(hub, texts, docs, seq_len, leading_bos(tokenizer))


def _hub_result(hub: dict, texts: list[str], docs: list[list[int]], seq_len: int, bos):
    corpus = Corpus(f"hub:{hub['name']}", texts, digest(texts), dict(hub))
    return corpus, pack(docs, seq_len, bos)


def _take(texts: Iterable[str], tokenizer, n_tokens: int):
    """The shortest prefix of texts whose documents, each tokenized and followed by the
    end-of-text token, reach n_tokens; their token ids; and whether they reach it. Texts
    are tokenized in batches, so at most one batch is read past the prefix."""
    eos = tokenizer.eos_token_id
    taken: list[str] = []
    docs: list[list[int]] = []
    total, size, it = 0, 16, iter(texts)
    while batch := list(itertools.islice(it, size)):
        enc = tokenizer(batch, add_special_tokens=False)["input_ids"]
        for text, row in zip(batch, enc, strict=True):
            doc = row if eos is None else [*row, eos]
            taken.append(text)
            docs.append(doc)
            total += len(doc)
            if total >= n_tokens:
                return taken, docs, True
        size = min(2 * size, 512)
    return taken, docs, False


def _hub_texts(hub: dict, n_tokens: int) -> Generator[str, None, None]:
    """The non-blank texts of a hub dataset's rows as they stream; hub errors as
    UsageErrors."""
    name, field = hub["name"], hub["text_field"]
    where = {k: hub[k] for k in ("name", "config", "split", "text_field")}
    rows = None
    first = True
    while True:
        try:
            if rows is None:
                rows = iter(_hub_stream(name, hub["config"], hub["split"], hub["revision"]))
            row = next(rows)
        except StopIteration:
            return
        except Exception as exc:
            error = _hub_error(exc, **where, revision=hub["revision"])
            if error is None:
                raise
            raise error from exc
        value = row.get(field) if isinstance(row, dict) else None
        if not isinstance(row, dict) or field not in row or not isinstance(value, str | None):
            columns = ", ".join(row) if isinstance(row, dict) else type(row).__name__
            raise UsageError(
                f"dataset {name} has no string field {field!r} (its columns: {columns}); "
                "pass --text-field NAME"
            )
        if first:
            first = False
            print(
                f"causaldim: note: streaming {name} (config {hub['config'] or 'default'}, "
                f"split {hub['split']}, revision {hub['revision'][:12]}) up to "
                f"{n_tokens:,} tokens",
                file=sys.stderr,
            )
        if value and value.strip():
            yield value


# The cache of streamed texts: one sealed JSON per name, config, split, text field,
# token budget (the file's base) and commit sha (its suffix).


def _cache_base(n_tokens: int, **where) -> str:
    key = json.dumps({**where, "n_tokens": n_tokens}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _cache_file(base: str, sha: str) -> Path:
    return cache_dir() / f"hub-corpus-{base}-{sha[:12]}.json"


def _read_cache(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        obj = read_sealed_json(path, "corpus")
        if isinstance(obj["texts"], list) and obj["hub"]["revision"]:
            return obj
    except (IntegrityError, KeyError, TypeError):
        pass
    print(f"causaldim: note: {path} is damaged; not using it", file=sys.stderr)
    return None


def _offline_cache(base: str, revision: str | None) -> dict | None:
    """Without the network: the cached copy of a pinned revision (a commit sha or its
    prefix, or the branch or tag it was read at), or under HF_HUB_OFFLINE=1 the latest
    cached copy for these settings."""
    if revision is None and not hf.offline():
        return None
    files = sorted(
        cache_dir().glob(f"hub-corpus-{base}-*.json"), key=lambda p: p.stat().st_mtime_ns
    )
    for path in reversed(files):
        obj = _read_cache(path)
        if obj is None:
            continue
        if revision is None or obj["hub"]["revision"].startswith(revision):
            return obj
        if obj.get("requested_revision") == revision:
            return obj
    return None


# --- Hub failures, each as one line that names the fix ---------------------------------


def _no_network(exc: BaseException, name: str, revision: str | None) -> UsageError:
    cached = "; no copy of it is cached for these settings" if revision or hf.offline() else ""
    return UsageError(
        f"the Hugging Face Hub cannot be reached for dataset {name} "
        f"({type(exc).__name__}){cached}: pass a local file or folder as --corpus, or "
        "reuse the copy an earlier online run with the same settings cached, with "
        "HF_HUB_OFFLINE=1 or with --corpus-revision SHA (the revision its results.json records)"
    )


def _names(text: str, limit: int = 20) -> str | None:
    """The list in an upstream message ("... Available: ['a', 'b']"), shortened."""
    found = re.search(r"\[([^\]]*)\]", text)
    if not found:
        return None
    try:
        names = [str(n) for n in ast.literal_eval(f"[{found.group(1)}]")]
    except (ValueError, SyntaxError):
        return None
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _hub_error(
    exc: BaseException,
    *,
    name: str,
    config: str | None,
    split: str,
    revision: str | None,
    text_field: str,
) -> UsageError | None:
    """The UsageError of a failure of the hub or of datasets, None for anything else."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        from datasets.exceptions import DatasetNotFoundError, DatasetsError
    except ImportError:
        DatasetNotFoundError = DatasetsError = ()  # noqa: N806
    text = str(exc)
    if isinstance(exc, GatedRepoError) or (
        isinstance(exc, DatasetNotFoundError) and "gated" in text
    ):
        return UsageError(
            f"dataset {name} is gated: accept its terms at "
            f"https://huggingface.co/datasets/{name}, then `huggingface-cli login` (or "
            "`hf auth login`) or set HF_TOKEN"
        )
    if isinstance(exc, RevisionNotFoundError) or (
        isinstance(exc, DatasetNotFoundError) and text.startswith("Revision")
    ):
        return UsageError(
            f"dataset {name} has no revision {revision!r}; pass a branch, tag or commit sha "
            "of it as --corpus-revision"
        )
    if isinstance(exc, (RepositoryNotFoundError, DatasetNotFoundError)):
        return UsageError(
            f"corpus {name!r} is neither a local file or folder nor a dataset on the Hugging "
            "Face Hub (a private one needs `huggingface-cli login` or HF_TOKEN); check the "
            "name, e.g. NeelNanda/pile-10k"
        )
    if isinstance(exc, HFValidationError):
        return UsageError(
            f"corpus {name!r} is neither a local file or folder nor a valid hub dataset name "
            f"({hf.first_line(exc)}); pass an existing path or owner/name"
        )
    if hf.is_network_error(exc):
        return _no_network(exc, name, revision)
    if isinstance(exc, ValueError) and ("BuilderConfig" in text or "Config name" in text):
        names = _names(text)
        have = f"; pass --corpus-config one of: {names}" if names else ""
        if config is None:
            return UsageError(f"dataset {name} has several configs{have or '; pass one'}")
        return UsageError(f"dataset {name} has no config {config!r}{have}")
    if isinstance(exc, ValueError) and text.startswith("Bad split"):
        names = _names(text)
        have = f"; pass --corpus-split one of: {names}" if names else ""
        return UsageError(f"dataset {name} has no split {split!r}{have}")
    if isinstance(exc, (HfHubHTTPError, DatasetsError)):
        return UsageError(f"cannot stream dataset {name}: {hf.first_line(exc)}")
    return None
