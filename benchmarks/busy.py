"""Wall times of whole runs, alone and side by side, against their --dry-run estimates.

    .venv/bin/python benchmarks/busy.py                        # the issue's four cases
    .venv/bin/python benchmarks/busy.py --cases smoke pair --threads default 1
    .venv/bin/python benchmarks/busy.py --cases pair --env OMP_WAIT_POLICY=ACTIVE

Each case runs `causaldim run --quiet` into new folders (nothing reused), as a user
would from a shell:
- smoke: `--preset smoke`, alone;
- pair: two `--preset smoke` runs started together (seeds 0 and 1), each timed;
- default: the default preset, alone (what `make run` runs after set-up);
- controls: `--preset smoke --controls all`, alone.
Before each, `--dry-run` of the same command gives the time it estimates. The table
gives each process's wall time, its ratio to the smoke run alone measured in the same
invocation (the pair's target: each within 2.5x), the estimate and estimate / measured
(target: within 1.5x either way), and the stages' seconds as results.json recorded them.
--threads repeats the cases per thread setting ('default' passes no --threads); --env
sets variables for every process (to compare OpenMP wait policies, say).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "smoke": (["--preset", "smoke"], 1),
    "pair": (["--preset", "smoke"], 2),
    "default": ([], 1),
    "controls": (["--preset", "smoke", "--controls", "all"], 1),
}
TARGETS = {"smoke": 60, "default": 240, "controls": 300}  # seconds, the issue's


def command(args: list[str], out: Path, seed: int, threads: str) -> list[str]:
    cmd = [sys.executable, "-m", "causaldim", "run", *args, "--out", str(out), "--quiet"]
    cmd += ["--seed", str(seed)] if seed else []
    return cmd + ([] if threads == "default" else ["--threads", threads])


def estimate_seconds(cmd: list[str], env: dict) -> float | None:
    """The --dry-run's 'about X min' of this command, in seconds."""
    dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, env=env)
    found = re.search(r"about ([\d.,]+) min", dry.stdout)
    return None if found is None else 60 * float(found.group(1).replace(",", ""))


def run_together(cmds: list[list[str]], env: dict) -> list[float]:
    """Start every command at once; each one's wall seconds."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        for c in cmds
    ]
    walls = []
    for p in procs:
        _, err = p.communicate()
        walls.append(time.perf_counter() - start)
        if p.returncode != 0:
            sys.exit(f"run failed ({p.returncode}): {err.decode()[-2000:]}")
    return walls


def stages(out: Path) -> str:
    seconds = json.loads((out / "results.json").read_text())["seconds"]
    return ", ".join(f"{k} {v:.0f}" for k, v in seconds.items() if k != "total" and v >= 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--threads", nargs="+", default=["default"])
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f} at the start")
    rows, alone = [], {}
    with tempfile.TemporaryDirectory(prefix="busy-") as tmp:
        for threads in args.threads:
            for case in args.cases:
                flags, n = CASES[case]
                outs = [Path(tmp) / f"{case}-t{threads}-{i}" for i in range(n)]
                cmds = [command(flags, out, i, threads) for i, out in enumerate(outs)]
                est = estimate_seconds(cmds[0], env)
                print(f"$ {' '.join(cmds[0][2:])}{'  (x2, together)' if n > 1 else ''}")
                walls = run_together(cmds, env)
                if case == "smoke":
                    alone[threads] = walls[0]
                for out, wall in zip(outs, walls, strict=True):
                    rows.append((case, threads, wall, est, stages(out)))
                    print(f"  {wall:.0f} s ({stages(out)})", flush=True)
    print(
        "\n| case | threads | wall s | / smoke alone | target | dry-run estimate s "
        "| estimate / wall | stages (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for case, threads, wall, est, parts in rows:
        ratio = f"{wall / alone[threads]:.2f}" if threads in alone else "-"
        target = "each <= 2.5x alone" if case == "pair" else f"< {TARGETS[case]} s"
        shown = "-" if est is None else f"{est:.0f}"
        versus = "-" if est is None else f"{est / wall:.2f}"
        print(
            f"| {case} | {threads} | {wall:.0f} | {ratio} | {target} | {shown} | {versus} "
            f"| {parts} |"
        )


if __name__ == "__main__":
    main()
