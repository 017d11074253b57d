"""Does SAELens open causaldim's export and encode as causaldim does? For each
architecture: an SAE with random weights (JumpReLU thresholds and biases set so that
features fire), exported with `causaldim export`'s writer, loaded with SAELens'
`SAE.load_from_disk`, and both encoders run on the same inputs: prints the largest
difference of the encodings and of the reconstructions, and the hook SAELens reads.

Runs in the anchors environment (SAELens is never a causaldim dependency):

    bash benchmarks/setup_anchors.sh
    benchmarks/.venv-anchors/bin/python benchmarks/saelens_export.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from sae_lens import SAE as SAELensSAE

from causaldim.sae import SAEConfig, build
from causaldim.sae.formats import export_saelens

D, WIDTH, K, TOKENS = 64, 256, 8, 512


def random_sae(arch: str):
    gen = torch.Generator().manual_seed(0)
    sae = build(SAEConfig(arch, D, WIDTH, k=K if arch == "topk" else None))
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        if arch == "jumprelu":
            sae.log_threshold.copy_(torch.full((WIDTH,), 0.2).log())
    return sae.requires_grad_(False)


def main() -> None:
    x = torch.randn(TOKENS, D, generator=torch.Generator().manual_seed(1))
    print(
        f"{'arch':<9} {'max |f - f_saelens|':>20} {'max |x^ - x^_saelens|':>22} {'fired':>6}  hook"
    )
    for arch in ("topk", "jumprelu", "relu"):
        ours = random_sae(arch)
        with tempfile.TemporaryDirectory() as tmp:
            folder = export_saelens(ours, Path(tmp) / arch, layer=3)
            theirs = SAELensSAE.load_from_disk(str(folder), device="cpu")
            f, f_theirs = ours.encode(x), theirs.encode(x)
            x_hat, x_hat_theirs = ours.decode(f), theirs.decode(f_theirs)
            print(
                f"{arch:<9} {(f - f_theirs).abs().max().item():>20.3g} "
                f"{(x_hat - x_hat_theirs).abs().max().item():>22.3g} "
                f"{(f > 0).float().sum(1).mean().item():>6.1f}  {theirs.cfg.metadata.hook_name}"
            )


if __name__ == "__main__":
    main()
