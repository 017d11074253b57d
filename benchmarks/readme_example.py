"""The README's example output of `make run`, rendered from a finished run's results.json
as `causaldim run` prints it (the long lines cut at 100 characters), so that it is never
typed by hand.

    .venv/bin/python benchmarks/readme_example.py runs/default --commit abc1234 [--write]

With it, the README's figures of its two runs side by side (this run and docs/replicate:
the claims' verdict counts and every number set beside the paper's). Without --write it
prints both blocks; with it, it rewrites them in README.md between their markers
(tests/test_readme.py fails when they drift).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"
BEGIN = "<!-- example output: python benchmarks/readme_example.py -->"
END = "<!-- end of example output -->"
WIDTH = 100


def block(run: Path, commit: str) -> str:
    from causaldim.report.direct import sigma_table
    from causaldim.report.results import load_results
    from causaldim.report.sections import summary

    results = load_results(run / "results.json")
    lines = [*sigma_table(results).splitlines(), *summary(results).splitlines()]
    lines = [line if len(line) <= WIDTH else line[: WIDTH - 4] + " ..." for line in lines]
    recorded = results["seconds"]["total"]
    lines.append(f"results: runs/default/results.json (recorded: {recorded:.0f} s)")
    return (
        f"The end of `make run` from a fresh clone at {commit} (the long lines cut):\n\n"
        + "```\n"
        + "\n".join(lines)
        + "\n```"
    )


FIGURES_BEGIN = "<!-- figures: python benchmarks/readme_example.py -->"
FIGURES_END = "<!-- end of figures -->"


def figures_block(default: Path, replicate: Path) -> str:
    """The README's two runs side by side: the claims' verdict counts of the replicate run
    and every number the report sets beside the paper's, from their results.json."""
    from causaldim.report.first_screen import claims_lines
    from causaldim.report.paper_figures import figures
    from causaldim.report.results import load_results

    runs = [load_results(p / "results.json") for p in (default, replicate)]
    verdicts = "; ".join(line.removesuffix(" (claims.md)") for line in claims_lines(runs[1], False))
    shown = [figures(r) for r in runs]
    lines = [
        f"The replicate run's verdicts (`docs/claims.md`): {verdicts}. Beside the paper, "
        f"from each run's results.json (`{default}`, `{replicate}`):",
        "",
        "| quantity | `--preset default` (degenerate) | `--preset replicate` (the paper's "
        "regime) | paper |",
        "| --- | --- | --- | --- |",
    ]
    for key, fig in shown[1].items():
        mine = shown[0].get(key)
        cells = [fig.label, mine.this_run if mine else "", fig.this_run, fig.paper]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run's folder (its results.json)")
    ap.add_argument("--commit", required=True, help="the commit the run was made from")
    ap.add_argument("--replicate", type=Path, default=Path("docs/replicate"))
    ap.add_argument("--write", action="store_true", help="rewrite README.md's blocks")
    args = ap.parse_args()
    blocks = {
        (BEGIN, END): block(args.run, args.commit),
        (FIGURES_BEGIN, FIGURES_END): figures_block(args.run, args.replicate),
    }
    if not args.write:
        print("\n\n".join(blocks.values()))
        return
    readme = README.read_text()
    for (begin, end), text in blocks.items():
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(readme):
            sys.exit(f"README.md has no {begin} ... {end} markers")
        readme = pattern.sub(lambda _, b=begin, e=end, t=text: f"{b}\n{t}\n{e}", readme)
    README.write_text(readme)
    print(f"wrote the example output of {args.run} and the figures into {README}")


if __name__ == "__main__":
    main()
