"""Named places where a test can stop a run, as a kill would, to check that the run
resumes. With CAUSALDIM_FAULT=name:n, the n-th pass through `name` since the run began
(reset()) raises InjectedFault; unset, a point costs one environment lookup."""

from __future__ import annotations

import os

ENV = "CAUSALDIM_FAULT"
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
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == int(nth or 1):
        raise InjectedFault(f"injected fault at {name} (pass {_seen[name]})")
