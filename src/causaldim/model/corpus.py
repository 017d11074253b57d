"""Corpora and their tokenisation into fixed-length sequences, split into train and eval."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from ..errors import IntegrityError, UsageError
from ..fileio import cache_dir, read_sealed_json, write_sealed_json
from . import prose


class Corpus(NamedTuple):
    id: str
    texts: list[str]
    sha256: str
    # A hub dataset's name, config, split, resolved revision (commit sha) and text field.
    hub: dict | None = None

    @property
    def n_chars(self) -> int:
        return sum(map(len, self.texts))

    @property
    def label(self) -> str:
        """The id, and for a hub dataset what of it was read."""
        if not self.hub:
            return self.id
        h = self.hub
        config = f"config {h['config']}, " if h.get("config") else ""
        return (
            f"{self.id} ({config}split {h['split']}, revision {h['revision'][:12]}, "
            f"field {h['text_field']}; {len(self.texts):,} docs)"
        )

    def describe(self) -> dict:
        return {
            "id": self.id,
            **({"hub": dict(self.hub)} if self.hub else {}),
            "sha256": self.sha256,
            "n_docs": len(self.texts),
            "n_chars": self.n_chars,
        }


class Splits(NamedTuple):
    """Token ids, one row a sequence; the two splits never share a sequence."""

    train: torch.Tensor  # [n_train, seq_len] int64
    eval: torch.Tensor  # [n_eval, seq_len] int64
    n_available: int  # whole sequences the corpus gave before truncation to --tokens
    # Every sequence, and the order of those beyond --tokens (the same seeded order):
    # where --until-converged draws its further eval rounds from, without a copy
    pool: torch.Tensor | None = None
    rest_order: torch.Tensor | None = None

    @property
    def n_rest(self) -> int:
        return 0 if self.rest_order is None else len(self.rest_order)

    def rest(self, start: int, stop: int) -> torch.Tensor:
        """The sequences beyond --tokens, from start to stop in their order."""
        assert self.pool is not None and self.rest_order is not None  # the corpus's pooled splits
        return self.pool[self.rest_order[start:stop]]


def describe_corpus(corpus: dict) -> str:
    """A corpus's manifest entry as a reader should know it."""
    cid = corpus["id"]
    if cid.startswith("builtin:stdlib-docstrings:python-"):
        version = cid.rsplit("-", 1)[1]
        return f"docstrings of the Python {version} standard library (built in)"
    if cid.startswith("mix:"):
        return " mixed with ".join(describe_corpus({"id": c}) for c in cid[4:].split("+"))
    if cid.startswith("builtin:") and cid.split(":")[1] in prose.PROSE:
        return prose.PROSE[cid.split(":")[1]].description + " (built in)"
    hub = corpus.get("hub")
    if hub:
        parts = ", ".join(str(hub[k]) for k in ("config", "split") if hub.get(k))
        return f"{hub['name']} ({parts}) from the Hugging Face Hub, revision {hub['revision']}"
    return cid.removeprefix("path:")


def digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def builtin_corpus() -> Corpus:
    """Docstrings of the running interpreter's standard library (modules, classes,
    functions), in sorted file order: deterministic for a given Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in skip]  # prune site-packages early
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    version = ".".join(map(str, sys.version_info[:3]))
    corpus_id = f"builtin:stdlib-docstrings:python-{version}"
    # Parsing the stdlib takes several seconds; the texts are cached, keyed by the files.
    listing = "\n".join(f"{p.relative_to(root).as_posix()} {p.stat().st_size}" for p in files)
    key = hashlib.sha256(f"{corpus_id}\n{root}\n{listing}".encode()).hexdigest()[:16]
    cached = cache_dir() / f"corpus-{key}.json"
    if cached.is_file():
        try:
            texts = read_sealed_json(cached, "corpus")["texts"]
            return Corpus(corpus_id, texts, digest(texts))
        except (IntegrityError, KeyError):  # a damaged cache is rebuilt, never used
            print(f"causaldim: note: {cached} is damaged; rebuilding it", file=sys.stderr)
    texts: list[str] = []
    for path in files:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in old modules
                tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        texts.extend(_docstrings(tree))
    try:
        write_sealed_json(cached, {"id": corpus_id, "texts": texts})
    except OSError:
        pass  # a read-only cache only costs time
    return Corpus(corpus_id, texts, digest(texts))


_DEFS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings(
    node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, min_chars: int = 40
):
    """Docstrings of a module and its classes and functions, depth first (cheaper than
    ast.walk, which visits every expression)."""
    doc = ast.get_docstring(node)
    if doc and len(doc) >= min_chars:
        yield doc
    stack = list(reversed(getattr(node, "body", [])))
    while stack:
        child = stack.pop()
        if isinstance(child, _DEFS):
            yield from _docstrings(child, min_chars)
        else:  # defs nested in if/try/with blocks
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(reversed(getattr(child, field, [])))


BUILT_IN = ("builtin", *prose.READERS)  # corpora that ship with the set-up


def is_built_in(spec: str) -> bool:
    """A built-in corpus's name, or a mixture of them joined by '+'."""
    return all(name in BUILT_IN for name in spec.split("+"))


def load_corpus(spec: str, text_field: str = "text") -> Corpus:
    """'builtin' (docstrings), 'speeches' or 'books' (prose.py), names of these joined by
    '+' (a mixture), a .txt file, a folder of .txt files, a .jsonl file or a local HF
    dataset."""
    if spec == "builtin":
        return builtin_corpus()
    if spec in prose.READERS:
        texts = prose.READERS[spec]()
        return Corpus(f"builtin:{spec}:{prose.PROSE[spec].pip_name}", texts, digest(texts))
    names = spec.split("+")
    if len(names) > 1 and not Path(spec).expanduser().exists():
        unknown = [n for n in names if n not in BUILT_IN]
        if unknown or len(set(names)) < len(names):
            raise UsageError(
                f"corpus {spec!r}: a mixture joins distinct built-in names with '+' "
                f"({', '.join(BUILT_IN)}); {', '.join(unknown) or 'a repeat'} "
                "is not one"
            )
        parts = [load_corpus(n) for n in names]
        texts = [t for c in parts for t in c.texts]
        return Corpus("mix:" + "+".join(c.id for c in parts), texts, digest(texts))
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(
            f"corpus {spec!r} does not exist; pass 'builtin', 'speeches', 'books' (or a "
            "mixture such as builtin+speeches), a file or folder, or a hub dataset name "
            "(owner/name)"
        )
    if path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            texts = _hf_dataset(path, text_field)
        else:
            files = sorted(path.rglob("*.txt"))
            if not files:
                raise UsageError(
                    f"corpus folder {path} holds no .txt files and is not a saved HF dataset"
                )
            texts = [_text_file(p) for p in files]
    elif path.suffix == ".jsonl":
        texts = _jsonl(path, text_field)
    else:
        texts = [_text_file(path)]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UsageError(f"corpus {spec!r} is empty; give it some text")
    return Corpus(f"path:{path.resolve()}", texts, digest(texts))


NOT_TEXT = 0.01  # a file with more undecodable or control characters than this is not text


def _text_file(path: Path) -> str:
    """A text file's contents as UTF-8, refused where it is not text (an executable, an
    archive): undecodable bytes and control characters other than white space."""
    text = path.read_text(encoding="utf-8", errors="replace")
    bad = sum(1 for ch in text if ch == "\ufffd" or (ch < " " and ch not in "\t\n\r\f\v"))
    if text and bad > NOT_TEXT * len(text):
        raise UsageError(
            f"corpus file {path} is not text: {100 * bad / len(text):.0f}% of its characters "
            "are undecodable bytes or control characters; pass UTF-8 text"
        )
    return text


def _jsonl(path: Path, field: str) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{i} is not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get(field), str):
                raise UsageError(
                    f"{path}:{i} has no string field {field!r}; pass --text-field NAME"
                )
            texts.append(row[field])
    return texts


def _hf_dataset(path: Path, field: str) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"{path} is a saved HF dataset; reading it needs: pip install datasets"
        ) from None
    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else ds[sorted(ds)[0]]
    if field not in ds.column_names:
        raise UsageError(
            f"dataset {path} has no column {field!r} (it has {', '.join(ds.column_names)}); "
            "pass --text-field NAME"
        )
    return [t for t in ds[field] if isinstance(t, str)]


def leading_bos(tokenizer) -> int | None:
    """The beginning-of-sequence token where the tokenizer puts one before every text
    (Gemma's <bos>: the model was trained with it at position 0 and misbehaves without
    it); None where it does not (SmolLM2, GPT-2)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return None
    ids = tokenizer("a")["input_ids"]
    return bos if ids and ids[0] == bos else None


def tokenize(corpus: Corpus, tokenizer, seq_len: int) -> torch.Tensor:
    """Pack documents, each followed by the end-of-text token, into rows of seq_len tokens
    (the tail that does not fill a row is dropped), each row opening with the
    tokenizer's leading BOS where it has one."""
    eos = tokenizer.eos_token_id
    docs: list[list[int]] = []
    batch = 512
    for start in range(0, len(corpus.texts), batch):
        enc = tokenizer(corpus.texts[start : start + batch], add_special_tokens=False)
        docs.extend(row if eos is None else [*row, eos] for row in enc["input_ids"])
    return pack(docs, seq_len, leading_bos(tokenizer))


def pack(docs: list[list[int]], seq_len: int, bos: int | None = None) -> torch.Tensor:
    ids = [i for doc in docs for i in doc]
    width = seq_len - (bos is not None)
    n = len(ids) // width
    rows = torch.tensor(ids[: n * width], dtype=torch.int64).view(n, width)
    if bos is not None:
        rows = torch.cat([torch.full((n, 1), bos, dtype=torch.int64), rows], dim=1)
    return rows


def split(sequences: torch.Tensor, n_tokens: int, eval_fraction: float, seed: int) -> Splits:
    """Shuffle sequences with the seed, keep n_tokens worth, cut into eval then train."""
    n_avail, seq_len = sequences.shape
    n = min(n_avail, max(n_tokens // seq_len, 2))
    if n < 2:
        raise UsageError(
            f"the corpus gives {n_avail} sequence(s) of {seq_len} tokens; at least 2 are "
            "needed (one train, one eval): use a larger corpus or a smaller --seq-len"
        )
    order = torch.randperm(n_avail, generator=torch.Generator().manual_seed(seed))
    n_eval = min(max(1, round(n * eval_fraction)), n - 1)
    chosen = sequences[order[:n]]
    return Splits(chosen[n_eval:], chosen[:n_eval], n_avail, sequences, order[n:])


def as_if_whole(splits: Splits, n_tokens: int, eval_fraction: float) -> Splits:
    """Splits of the size a corpus of n_tokens or more would give, for planning only: their
    rows hold no tokens (meta tensors), so that costs can be stated for data not here."""
    seq_len = splits.train.shape[1]
    n = max(n_tokens // seq_len, 2)
    n_eval = min(max(1, round(n * eval_fraction)), n - 1)

    def rows(k: int) -> torch.Tensor:
        return torch.empty(k, seq_len, dtype=torch.int64, device="meta")

    return Splits(rows(n - n_eval), rows(n_eval), n)


# --- The corpus of a run, local or a hub dataset streamed up to the token budget ---------


def budget_tokens(seq_len: int, tokens: int) -> int:
    """Packed tokens a run reads: --tokens rounded up to whole sequences, two at least."""
    return max(2, -(-tokens // seq_len)) * seq_len
