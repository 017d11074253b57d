"""The README's memory guide for --preset paper (Gemma-2-2B, seq 512, bf16), computed by
the memory model the dry run uses (causaldim.memory, disk.disk_bytes), offline from the
model's known shape. `python benchmarks/readme_memory.py` rewrites the table between its
markers in README.md; tests/test_docs.py checks the README holds what this computes."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"
BEGIN = "<!-- memory guide: python benchmarks/readme_memory.py -->"
END = "<!-- end of memory guide -->"
GIB, GB = 2**30, 1e9
GPUS = {"an H200": 141, "an 80 GB GPU": 80, "a 40 GB one": 40}  # GiB of memory


def _short(width: int) -> str:
    return f"{width / 1e6:.0f}M" if width >= 1e6 else f"{width / 1e3:.0f}k"


def table() -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the known shape: no network
    import torch

    from causaldim.devices import planning_for, resolve_dtype
    from causaldim.disk import checkpoint_bytes, disk_bytes, sweep_disk
    from causaldim.harvest.plan import plan
    from causaldim.memory import HEADROOM, SCORE_ROW_BYTES, sae_training_bytes, step_entries
    from causaldim.presets import preset_configs

    harvest, sweep, analysis = preset_configs("paper", out="/nonexistent/causaldim-memory-guide")
    with planning_for("h200"):
        p = plan(harvest, dry_run=True)
        sae_dtype = resolve_dtype(sweep.sae_dtype, torch.device("cuda"))  # as the plan does
    need, d = p.pass_memory, p.source.d_model
    batches = ", ".join(
        f"{need._replace(budget=int(HEADROOM * gib * GIB)).batch_that_fits()} on {name}"
        for name, gib in GPUS.items()
    )
    widest = max(sweep.widths)

    def training(width: int) -> float:
        per_token = step_entries(sweep.k, sweep.architectures)
        need = sae_training_bytes(
            d, width, sweep.batch_tokens, sae_dtype, sweep.optimizer, per_token
        )
        return need / GIB

    fits = [name for name, gib in GPUS.items() if training(widest) <= HEADROOM * gib]
    trained = ", ".join(f"{_short(w)} {training(w):,.1f} GiB" for w in (16_384, 131_072, widest))
    disk = disk_bytes(p, sweep, analysis)
    planned = (len(p.splits.train) + len(p.splits.eval)) * harvest.seq_len
    store = disk["store"] * harvest.tokens / planned  # the paper's tokens, from a hub corpus
    checkpoint = checkpoint_bytes(d, widest, sweep.optimizer)
    saes = sweep_disk(d, sweep, analysis.blocks)  # the paper's eval tokens fill every block
    least = store + saes["dropped"] + saes["scores"]
    per_weight = (
        "about 2 d m x 16 bytes (float32 weights, gradients, two Adam moments)"
        if sweep.optimizer == "adam"
        else "about 2 d m x 10 bytes with `--optimizer lean` (float32 weights and second "
        "moments, bfloat16 first moments), gradients only for the features a step names"
    )
    rows = [
        ("what", "memory"),
        ("---", "---"),
        (
            "model pass",
            f"{need.weights / GIB:.1f} GiB of weights + about {need.per_sequence / GIB:.1f} GiB "
            f"a sequence (the {p.source.config.vocab_size // 1000}k-wide logits): batch "
            f"{batches}",
        ),
        (
            "training an SAE of width m",
            f"{per_weight}, and the batch: {trained} "
            f"({' and '.join(fits) or 'none of these'} at the widest)",
        ),
        (
            f"scoring the {_short(widest)}-wide SAE",
            f"{2 * 4 * d * widest / GIB:.0f} GiB + about "
            f"{SCORE_ROW_BYTES * widest / 2**20:.0f} MiB a token, read a few thousand tokens "
            "at a time",
        ),
        (
            "disk, `--preset paper`",
            f"about {(store + saes['kept'] + saes['scores'] + 2 * checkpoint) / GB:,.0f} GB at "
            f"most: the store of the paper's {harvest.tokens / 1e6:.1f}M tokens "
            f"{store / GB:,.0f} GB, the SAEs {saes['kept'] / GB:,.0f} GB ({sweep.save_dtype} "
            f"weights, `--save-dtype`; {saes['dropped'] / GB:,.0f} GB with `--drop-weights`, "
            f"which keeps the reference and one width at a time), their scores "
            f"{saes['scores'] / GB:,.0f} GB, and the widest's training checkpoint "
            f"{checkpoint / GB:,.0f} GB while it trains, twice that at a save "
            f"(`--checkpoint-steps 0`: none; with both, {least / GB:,.0f} GB in all)",
        ),
    ]
    return "\n".join(f"| {a} | {b} |" for a, b in rows)


def in_readme(text: str) -> str | None:
    found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    return found.group(1) if found else None


def main() -> None:
    text = README.read_text()
    if in_readme(text) is None:
        sys.exit(f"README.md has no {BEGIN} ... {END} block")
    new = table()
    README.write_text(text.replace(in_readme(text), new))
    print(new)


if __name__ == "__main__":
    main()
