"""One run at a time in an output folder: a second process is refused with the first's
pid; a lock left by a killed run is taken over; the lock goes when the run ends."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from causaldim.errors import UsageError
from causaldim.lock import NAME, held

HOLD = """
import sys, time
from causaldim.lock import held
with held(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_process_is_refused_with_the_first_ones_pid(tmp_path):
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "held"
        said = f"in use by another causaldim run \\(pid {first.pid}\\)"
        with pytest.raises(UsageError, match=said), held(tmp_path):
            pass
    finally:
        first.kill()
        first.wait()
    # killed: its lock is stale and taken over, then released
    assert (tmp_path / NAME).exists()
    with held(tmp_path) as path:
        assert path.read_text().strip() != str(first.pid)
    assert not (tmp_path / NAME).exists()


def test_a_lock_with_no_live_process_is_stale(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    time.sleep(0.1)
    (tmp_path / NAME).write_text(f"{dead.pid}\n")
    with held(tmp_path):
        pass
    assert not (tmp_path / NAME).exists()
