"""One run at a time in an output folder: OUT/.causaldim.lock holds the pid of the run
that writes there. A second run is refused with that pid; a lock whose process is gone
(a run killed with SIGKILL) is stale and taken over."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError

NAME = ".causaldim.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        return True
    return True


def _holder(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def held(out: Path | str) -> Iterator[Path]:
    """Hold OUT's lock for the body; a UsageError naming the other run's pid if a live
    process holds it."""
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / NAME
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            pid = _holder(path)
            if pid is not None and pid != os.getpid() and _alive(pid):
                raise UsageError(
                    f"{out} is in use by another causaldim run (pid {pid}); wait for it to "
                    "finish, or pass another --out"
                ) from None
            path.unlink(missing_ok=True)  # stale: its run is gone
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        if _holder(path) == os.getpid():
            path.unlink(missing_ok=True)
        if created and not any(out.iterdir()):  # a run that wrote nothing leaves nothing
            out.rmdir()
