"""What share of a profile and of an atlas cell the finite-sample corrections take, beside
the model passes that feed them, each measured in the same run (issue 47: at most a
quarter of the run).

1. `causaldim run --preset smoke --profile`: results.json's seconds of the profile stage
   (every layer's estimates, both readings' corrections) against the run's total.
2. One atlas cell (the embedded model, every layer, both outlier rules): the cell's
   seconds_parts (its full pass, its headline pass, the estimates) against its total.

    .venv/bin/python benchmarks/corrections_share.py [--eval-tokens 16384]
        [--headline-tokens 16384] [--out /tmp/corrections_share]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from causaldim import cli
from causaldim.fileio import read_sealed_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--eval-tokens", type=int, default=16_384, help="the atlas cell's")
    ap.add_argument("--headline-tokens", type=int, default=16_384, help="the atlas cell's")
    ap.add_argument("--out", default="/tmp/corrections_share")
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)

    smoke = out / "smoke"
    argv = ["--quiet", "run", "--preset", "smoke", "--profile", "--model", args.model]
    assert cli.main([*argv, "--out", str(smoke)]) == 0
    sec = json.loads((smoke / "results.json").read_text())["seconds"]
    passes = sec["harvest"] + sec.get("headline", 0.0)
    smoke_line = (
        f"smoke --profile: total {sec['total']:.1f} s, passes {passes:.1f} s, profile "
        f"estimates {sec['profile']:.1f} s: {sec['profile'] / sec['total']:.2f} of the run, "
        f"{sec['profile'] / passes:.2f} of its passes"
    )

    atlas = out / "atlas"
    argv = ["--quiet", "atlas", "--models", args.model, "--corpora", "builtin"]
    argv += ["--seq-lens", "128", "--eval-tokens", str(args.eval_tokens)]
    argv += ["--headline-tokens", str(args.headline_tokens), "--out", str(atlas)]
    assert cli.main(argv) == 0
    (path,) = (atlas / "cells").glob("*.json")
    cell = read_sealed_json(path, "atlas cell")
    parts, total = cell["seconds_parts"], cell["seconds"]
    shown = sum(
        1
        for rules in cell["layers"].values()
        for readings in rules.values()
        for est in readings.values()
        if est.get("erank_corrected") is not None
    )
    print(
        f"atlas cell {path.stem} ({cell['eval_tokens']:,} + {cell['headline_tokens']:,} "
        f"headline tokens, {len(cell['layers'])} layers, {shown} corrected readings): total "
        f"{total:.1f} s, pass {parts['pass']:.1f} s, headline pass "
        f"{parts['headline_pass']:.1f} s, estimates {parts['estimates']:.1f} s: "
        f"{parts['estimates'] / total:.2f} of the cell"
    )
    print(smoke_line)  # last, below what the runs print


if __name__ == "__main__":
    main()
