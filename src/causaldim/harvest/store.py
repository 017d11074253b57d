"""The activation-and-gradient store: per-token rows in safetensors shards plus a manifest.

Per split, each shard holds whole sequences, flattened to tokens:
  h        [n, d]  residual stream at the output of block L
  g        [n, d]  dLoss/dh (eval split only), loss = next-token CE summed over positions
  u_logits [n, K, d]  J^T (v - mean v) for K Gaussian probes v over the logits (eval,
                      when asked): the probe with its shift of all logits taken out
  u_shift  [n, K, d]  J^T (mean(v) 1), the same probes' shift parts (u_logits + u_shift
                      is J^T v, the uncentred probe's product)
  u_fisher [n, K, d]  J^T (onehot(y) - p), y drawn from the model's softmax (eval, when asked)
  token    [n]     token id at that position
  pos      [n]     position in its sequence
  seq      [n]     sequence index within the split
  outlier  [n]     position 0, or ||h|| above the manifest's threshold; left out downstream
The manifest is written last: a folder without one is an unfinished store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save as save_safetensors

from ..errors import IntegrityError, UsageError
from ..fileio import atomic_write_bytes, read_sealed_json, sha256_file, write_sealed_json

FORMAT = "causaldim-store/1"
MANIFEST = "manifest.json"
FLOAT_FIELDS = ("h", "g", "u_logits", "u_shift", "u_fisher")
_FP16_MAX = 60_000.0


def key_digest(key: dict) -> str:
    """The sha256 of a store's key (what was harvested, and how): it names the store's
    folder, and the SAEs trained from the store record it."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


class StoreError(IntegrityError):
    """A store on disk is missing, unfinished or damaged."""


class UnfinishedStore(StoreError):
    """A store folder without its manifest: its pass never finished."""


class ShardWriter:
    """Buffers rows and writes a shard each time shard_tokens rows have gathered."""

    def __init__(self, root: Path, split: str, store_dtype: str, shard_tokens: int):
        self.root, self.split, self.shard_tokens = Path(root), split, shard_tokens
        self.dtype = getattr(torch, store_dtype)
        self.shards: list[dict] = []
        self.fields: list[str] = []
        self._buffer: dict[str, list[torch.Tensor]] = {}
        self._buffered = 0

    def add(self, **columns: torch.Tensor) -> None:
        for name, col in columns.items():
            self._buffer.setdefault(name, []).append(col.detach().cpu())
            if name not in self.fields:
                self.fields.append(name)
        self._buffered += len(next(iter(columns.values())))
        if self._buffered >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        tensors, metadata = {}, {}
        for name, parts in self._buffer.items():
            col = torch.cat(parts)
            if name in FLOAT_FIELDS:
                col, scale = self._encode(col.float())
                metadata[f"scale.{name}"] = repr(scale)
            tensors[name] = col.contiguous()
        name = f"{self.split}-{len(self.shards):05d}.safetensors"
        digest = atomic_write_bytes(self.root / name, save_safetensors(tensors, metadata))
        self.shards.append({"file": name, "n_tokens": self._buffered, "sha256": digest})
        self._buffer, self._buffered = {}, 0

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, float]:
        """float16 needs a scale to hold small gradients; others are stored as they are."""
        if self.dtype != torch.float16:
            return x.to(self.dtype), 1.0
        peak = float(x.abs().max()) if x.numel() else 0.0
        scale = 2.0 ** int(torch.tensor(_FP16_MAX / peak).log2().floor()) if peak > 0 else 1.0
        return (x * scale).to(torch.float16), scale


def n_blocks(n_sequences: int, wanted: int) -> int:
    """How many sequence blocks a split is cut into for bootstraps: at most one each."""
    return max(1, min(wanted, n_sequences))


def block_of(seq: torch.Tensor, blocks: int, n_sequences: int) -> torch.Tensor:
    """The block of each token, from its sequence index. Sequences were shuffled before
    the split, so contiguous blocks are random ones."""
    return (seq.long() * blocks) // n_sequences


class Store:
    """Read access to a finished store."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        path = self.root / MANIFEST
        if not path.is_file():  # the manifest is written last: the pass did not finish
            raise UnfinishedStore(f"{self.root} holds no finished store (no {MANIFEST})")
        self.manifest = read_sealed_json(path, "store")
        if self.manifest.get("format") != FORMAT:
            raise StoreError(f"{path} is not a {FORMAT} manifest")

    @property
    def d_model(self) -> int:
        return int(self.manifest["model"]["d_model"])

    def n_tokens(self, split: str, drop_outliers: bool = False) -> int:
        info = self.manifest["splits"][split]
        return info["n_tokens"] - (info["n_outliers"] if drop_outliers else 0)

    def blocks(self, split: str, wanted: int) -> int:
        return n_blocks(self.manifest["splits"][split]["n_sequences"], wanted)

    def block_of(self, split: str, seq: torch.Tensor, blocks: int) -> torch.Tensor:
        return block_of(seq, blocks, self.manifest["splits"][split]["n_sequences"])

    def token_ids(self, split: str, n: int) -> torch.Tensor:
        """The first n sequences' token ids, [n, seq_len], from the store itself."""
        seq_len = self.manifest["seq_len"]
        batch = next(self.batches(split, ("token",), n * seq_len, drop_outliers=False))
        return batch["token"].long().view(-1, seq_len)[:n]

    def verify(self) -> None:
        """Check every shard's presence and sha256 against the manifest."""
        for split, info in self.manifest["splits"].items():
            for shard in info["shards"]:
                path = self.root / shard["file"]
                fix = "rerun with --repair to harvest the store again"
                if not path.is_file():
                    raise StoreError(
                        f"store {self.root}: {split} shard {shard['file']} is missing; {fix}"
                    )
                if sha256_file(path) != shard["sha256"]:
                    raise StoreError(
                        f"store {self.root}: {split} shard {shard['file']} does not match its "
                        f"hash (damaged or changed); {fix}"
                    )

    def shards(self, split: str, fields: tuple[str, ...]) -> Iterator[dict[str, torch.Tensor]]:
        """Whole shards, one at a time; float fields come back as float32, unscaled."""
        if split not in self.manifest["splits"]:
            raise UsageError(f"the store has no {split!r} split")
        for shard in self.manifest["splits"][split]["shards"]:
            with safe_open(self.root / shard["file"], framework="pt") as f:
                meta = f.metadata() or {}
                missing = set(fields) - set(f.keys())
                if missing:
                    raise StoreError(f"{shard['file']} has no field(s) {sorted(missing)}")
                out = {}
                for name in fields:
                    col = f.get_tensor(name)
                    if name in FLOAT_FIELDS:
                        col = col.float() / float(meta.get(f"scale.{name}", "1.0"))
                    out[name] = col
            yield out

    def batches(
        self,
        split: str,
        fields: tuple[str, ...] = ("h", "g"),
        batch_tokens: int = 4096,
        drop_outliers: bool = True,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Streams tokens in order, batch_tokens at a time (the last batch may be short).
        A batch within one shard is a view of it; only batches that span two shards are
        copied (re-joining a shard's remainder for every batch copied it 8x over)."""
        read = tuple(dict.fromkeys((*fields, "outlier") if drop_outliers else fields))
        pending: list[dict[str, torch.Tensor]] = []  # pieces of the next batch
        count = 0
        for shard in self.shards(split, read):
            if drop_outliers:
                keep = ~shard["outlier"]
                shard = {name: shard[name][keep] for name in fields}
            start, n = 0, len(shard[fields[0]])
            while count + n - start >= batch_tokens:
                take = batch_tokens - count
                pending.append({name: shard[name][start : start + take] for name in fields})
                yield _joined(pending, fields)
                pending, count, start = [], 0, start + take
            if start < n:
                pending.append({name: shard[name][start:] for name in fields})
                count += n - start
        if count:
            yield _joined(pending, fields)


def _joined(pieces: list[dict[str, torch.Tensor]], fields) -> dict[str, torch.Tensor]:
    if len(pieces) == 1:
        return pieces[0]
    return {name: torch.cat([p[name] for p in pieces]) for name in fields}


def write_store(
    root: Path | str,
    splits: dict[str, dict[str, torch.Tensor]],
    seq_len: int,
    description: dict,
    store_dtype: str = "float32",
) -> Store:
    """A store from arrays that no model pass made (toy models, tests): per split, the
    columns h (and g for eval) as [sequences * seq_len, d]; token, pos, seq and outlier
    are filled in (nothing is an outlier). `description` names the source in the
    manifest's model entry."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    info = {}
    d_model = None
    for split, cols in splits.items():
        n = len(cols["h"])
        d_model = cols["h"].shape[1]
        if n % seq_len:
            raise ValueError(f"{split}: {n} rows is not a whole number of {seq_len}-sequences")
        writer = ShardWriter(root, split, store_dtype, shard_tokens=1 << 16)
        pos = torch.arange(n) % seq_len
        writer.add(
            **cols,
            token=torch.zeros(n, dtype=torch.int32),
            pos=pos.to(torch.int32),
            seq=(torch.arange(n) // seq_len).to(torch.int32),
            outlier=torch.zeros(n, dtype=torch.bool),
        )
        writer.flush()
        info[split] = {
            "n_sequences": n // seq_len,
            "n_tokens": n,
            "n_outliers": 0,
            "fields": writer.fields,
            "shards": writer.shards,
        }
    manifest = {
        "format": FORMAT,
        "key": {"synthetic": description},
        "model": {"identity": description, "d_model": d_model},
        "layer": 0,
        "seq_len": seq_len,
        "store_dtype": store_dtype,
        "outliers": {"threshold": torch.finfo(torch.float32).max, "n_outliers": 0},
        "splits": info,
    }
    write_sealed_json(root / MANIFEST, manifest)
    return Store(root)
