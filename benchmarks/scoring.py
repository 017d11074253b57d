"""Scoring a whole SAE sweep from the cache against re-running the model once per width.

Per-SAE attribution tools run the model forward and backward for every SAE they score.
causaldim runs it once (the eval pass that writes h and g) and scores every width from
the store with matrix products. Both are timed here on the same eval tokens of a finished
run: (a) AtP of every SAE from the store; (b) per SAE, the forward and backward down to
layer L on the same tokens, then the same scoring. The one-time pass is timed too, so the
ratio with the cache's own cost included is printed beside the ratio without it.

    .venv/bin/python benchmarks/scoring.py --run runs/default
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from causaldim.harvest.model_pass import grads_at
from causaldim.harvest.store import Store
from causaldim.measures.score import atp_scores
from causaldim.model.load import load_model, resolve_model
from causaldim.sae.formats import load


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", default="runs/default", help="a finished `causaldim run` folder")
    p.add_argument("--sequences", type=int, default=8, help="eval sequences timed per width")
    args = p.parse_args()

    run = Path(args.run)
    (manifest,) = run.glob("stores/*/manifest.json")
    store = Store(manifest.parent)
    m = store.manifest
    saes = {f.name: load(f) for f in sorted((run / "saes").iterdir()) if f.is_dir()}
    for sae in saes.values():
        sae.requires_grad_(False)
    n_eval = store.n_tokens("eval")

    t = time.perf_counter()
    for sae in saes.values():
        atp_scores(sae, store)
    cached = time.perf_counter() - t

    lm = load_model(resolve_model(m["model"]["identity"]["name"]), m["dtype"])
    seq_len = m["seq_len"]
    rows = next(store.shards("eval", ("token",)))["token"].long().view(-1, seq_len)
    ids = rows[: args.sequences]
    t = time.perf_counter()
    for sae in saes.values():
        grads = grads_at(lm, (m["layer"],), ids)[m["layer"]]
        h, g = grads.h.flatten(0, 1), grads.g.flatten(0, 1)
        with torch.no_grad():
            (sae.encode(h) * (g @ sae.W_dec.T)).abs().sum(0)
    per_width_sample = time.perf_counter() - t
    scale = n_eval / ids.numel()  # the same work on the whole eval split
    rerun = per_width_sample * scale
    one_pass = rerun / len(saes)

    print(f"{len(saes)} SAEs ({', '.join(saes)}), {n_eval:,} eval tokens, layer {m['layer']}")
    print(f"  (a) all SAEs scored from the cache: {cached:.1f} s")
    print(
        f"  (b) model forward + backward per SAE, then scoring: {rerun:.1f} s (timed on "
        f"{ids.numel():,} tokens, scaled x{scale:.1f})"
    )
    print(f"  (b) / (a) = {rerun / cached:.0f}x")
    print(
        f"  with the one model pass the cache costs counted: (b) / (a + one pass) = "
        f"{rerun / (cached + one_pass):.1f}x"
    )


if __name__ == "__main__":
    main()
