"""Diff two results.json files key path by key path: has a change to the code changed any
number a run reports?

    python benchmarks/results_diff.py OLD/results.json NEW/results.json

Timings, dates, hashes of files that record timings, and whether an artifact was reused
are left out (they differ between any two runs). Prints every path whose value differs
or that one file lacks, and exits 1 if a value changed or a path of OLD is gone; paths
only NEW has (added results) are listed and allowed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

# Paths (dot-joined; list items by index) that differ between any two runs, and the
# output folder, which differs between two runs compared side by side.
IGNORED = [
    r"^config\.harvest\.out$",
    r"(^|\.)seconds(\.|$)",
    r"^started$",
    r"^sealed_sha256$",
    r"^inputs\.store\.manifest_sha256$",
    r"^store\.throughput_tokens_per_second\.",
    r"^store\.reused$",
    r"^saes\.[^.]+\.reused$",
]


def flatten(obj, prefix: str = "") -> dict[str, object]:
    """{key path: leaf value}; an empty dict or list is a leaf of its own."""
    if isinstance(obj, dict) and obj:
        items = obj.items()
    elif isinstance(obj, list) and obj:
        items = enumerate(obj)
    else:
        return {prefix: obj}
    out = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def diff(old: dict, new: dict) -> tuple[list[str], list[str], list[str], int]:
    """(changed, only in old, only in new) key paths and the number of equal values, the
    ignored paths left out."""
    ignored = re.compile("|".join(IGNORED))
    a = {k: v for k, v in flatten(old).items() if not ignored.search(k)}
    b = {k: v for k, v in flatten(new).items() if not ignored.search(k)}
    changed = [k for k in a.keys() & b.keys() if not same(a[k], b[k])]
    equal = len(a.keys() & b.keys()) - len(changed)
    return sorted(changed), sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys()), equal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    old, new = (json.loads(p.read_text()) for p in (args.old, args.new))
    changed, gone, added, equal = diff(old, new)
    flat_old, flat_new = flatten(old), flatten(new)
    for k in changed:
        print(f"changed  {k}: {flat_old[k]!r} -> {flat_new[k]!r}")
    for k in gone:
        print(f"gone     {k}: {flat_old[k]!r}")
    for k in added:
        print(f"added    {k}: {flat_new[k]!r}")
    print(
        f"{equal} values equal, {len(changed)} changed, {len(gone)} gone, "
        f"{len(added)} added (timings, dates and reuse flags left out)"
    )
    return 1 if changed or gone else 0


if __name__ == "__main__":
    sys.exit(main())
