"""Atomic writes and hashes: every artifact is written to a temp file in its own folder,
fsynced, then renamed, so a reader never sees half a file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

# The process's umask, read once at import (reading it means setting it, which is not
# safe once other threads create files).
UMASK = os.umask(0)
os.umask(UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> str:
    """Write data to path atomically; returns its sha256."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; a plain file gets 0644
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def atomic_write_json(path: Path, obj) -> str:
    return atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


SEAL = "sealed_sha256"


def _canonical(obj: dict) -> bytes:
    return json.dumps({k: v for k, v in obj.items() if k != SEAL}, sort_keys=True).encode()


def write_sealed_json(path: Path, obj: dict) -> str:
    """atomic_write_json with the sha256 of the object's canonical form recorded in it, so
    that a reader can tell a whole file from a damaged one."""
    return atomic_write_json(path, {**obj, SEAL: hashlib.sha256(_canonical(obj)).hexdigest()})


def read_sealed_json(path: Path, what: str) -> dict:
    """The object write_sealed_json wrote; IntegrityError naming the file if it is
    missing, truncated or altered (files written before sealing are taken as they are)."""
    from .errors import IntegrityError

    path = Path(path)
    fix = f"rerun with --repair to recompute the {what}"
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise IntegrityError(f"{path} is missing; {fix}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{path} is damaged ({exc}); {fix}") from None
    if not isinstance(obj, dict):
        raise IntegrityError(f"{path} is damaged (not a JSON object); {fix}")
    seal = obj.get(SEAL)
    if seal is not None and seal != hashlib.sha256(_canonical(obj)).hexdigest():
        raise IntegrityError(f"{path} does not match its recorded sha256 (altered); {fix}")
    return obj


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """$CAUSALDIM_CACHE, else $XDG_CACHE_HOME/causaldim, else ~/.cache/causaldim."""
    if env := os.environ.get("CAUSALDIM_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "causaldim"
