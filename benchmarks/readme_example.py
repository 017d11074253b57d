"""The README's example output of `make run`, rendered from a finished run's results.json
as `causaldim run` prints it (the long lines cut at 100 characters), so that it is never
typed by hand.

    .venv/bin/python benchmarks/readme_example.py runs/default --commit abc1234 [--write]

Without --write it prints the block; with it, it rewrites the block in README.md between
its markers.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run's folder (its results.json)")
    ap.add_argument("--commit", required=True, help="the commit the run was made from")
    ap.add_argument("--write", action="store_true", help="rewrite README.md's block")
    args = ap.parse_args()
    text = block(args.run, args.commit)
    if not args.write:
        print(text)
        return
    readme = README.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        sys.exit(f"README.md has no {BEGIN} ... {END} markers")
    README.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", readme))
    print(f"wrote the example output of {args.run} into {README}")


if __name__ == "__main__":
    main()
