"""Named places where a test can stop a run, as a kill would, to check that the run
resumes. With CAUSALDIM_FAULT=name:n, the n-th pass through `name` since the run began
(reset()) raises InjectedFault; name:n:kill kills the process instead, as a lost worker.
With CAUSALDIM_FAULT_ONCE=path, a fault fires only if path does not exist yet, and creates
it (so that a retried job runs through). Unset, a point costs one environment lookup."""

from __future__ import annotations

import os
import signal

ENV, ONCE = "CAUSALDIM_FAULT", "CAUSALDIM_FAULT_ONCE"
_seen: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised at a fault point armed by CAUSALDIM_FAULT (tests only)."""


def reset() -> None:
    """Count passes afresh: called as a run begins."""
    _seen.clear()


def fault_point(name: str) -> None:
    spec = os.environ.get(ENV)
    if spec is None:
        return
    target, nth, action = (spec.split(":") + ["1", "raise"])[:3]
    if target != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] != int(nth):
        return
    if once := os.environ.get(ONCE):
        try:
            open(once, "x").close()
        except FileExistsError:
            return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"injected fault at {name} (pass {_seen[name]})")
