"""What the direct Sigma estimates cost, measured side by side in one run.

- One probe (a Gaussian logits probe or a Fisher probe) against the loss backward it
  rides along with: each probe is one more backward from the logits down to L, so the
  ratio should be about 1.
- Sigma_loss from the store against the eval pass that wrote it: no model work, so the
  ratio should be small.

    .venv/bin/python benchmarks/probes.py [--model smollm2-135m] [--reps 3]
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from timing import median_time

from causaldim.config import AnalysisConfig, HarvestConfig
from causaldim.harvest import harvest
from causaldim.harvest.model_pass import grads_at
from causaldim.measures.sigma import accumulate
from causaldim.model.corpus import load_corpus, tokenize
from causaldim.model.hooks import tap_blocks
from causaldim.model.load import load_model, resolve_model


def forward_only(lm, layer, ids):
    """The forward of the eval pass, graph recorded from L up, no backward."""
    with torch.enable_grad(), tap_blocks({layer: lm.layers[layer]}, "leaf"):
        return lm.model(input_ids=ids, use_cache=False).logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    args = ap.parse_args()

    source = resolve_model(args.model)
    layer = source.n_layers // 2
    lm = load_model(source)
    ids = tokenize(load_corpus("builtin"), lm.tokenizer, args.seq_len)[: args.batch_size]
    gen = torch.Generator().manual_seed(0)
    forward_only(lm, layer, ids)  # warm-up

    t_fwd = median_time(lambda: forward_only(lm, layer, ids), args.reps)
    t_loss = median_time(lambda: grads_at(lm, (layer,), ids)[layer], args.reps)
    t_back = t_loss - t_fwd
    print(
        f"{args.model} layer {layer}, batch {args.batch_size}x{args.seq_len}, median of {args.reps}"
    )
    print(f"forward {t_fwd:.2f} s; loss backward down to L {t_back:.2f} s")
    for kind, k in (("logits", 1), ("logits", 4), ("fisher", 1), ("fisher", 4)):
        probes = (k, 0) if kind == "logits" else (0, k)
        t = median_time(lambda p=probes: grads_at(lm, (layer,), ids, *p, gen)[layer], args.reps)
        per_probe = (t - t_loss) / k
        print(
            f"{kind} K={k}: pass {t:.2f} s, {per_probe:.2f} s per probe = "
            f"{per_probe / t_back:.2f} x the loss backward"
        )

    with tempfile.TemporaryDirectory() as tmp:
        cfg = HarvestConfig(
            model=args.model,
            tokens=4096,
            eval_fraction=0.5,
            logit_probes=0,
            fisher_probes=0,
            out=tmp,
        )
        result = harvest(cfg, progress=False)
        n_eval = result.store.n_tokens("eval")
        t_pass = n_eval / result.store.manifest["splits"]["eval"]["tokens_per_second"]
        t_sigma = median_time(
            lambda: accumulate(result.store, AnalysisConfig(), ("loss",)), args.reps
        )
        print(
            f"Sigma_loss from the store: {t_sigma:.2f} s for {n_eval} eval tokens, "
            f"{t_sigma / t_pass:.3f} x the eval pass that wrote them ({t_pass:.1f} s)"
        )


if __name__ == "__main__":
    main()
