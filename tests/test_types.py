"""The package type-checks: pyright in its basic mode ([tool.pyright] in pyproject.toml)
finds no error in src/, so `make test` (and CI) hold what `make lint` checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_pyright_finds_no_error_in_src():
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent))
    if pyright is None:
        pytest.skip("pyright is not installed (pip install -e '.[dev]')")
    done = subprocess.run(
        [pyright, "--outputjson"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    report = json.loads(done.stdout)
    errors = [
        f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}"
        for d in report["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    assert errors == [], "\n".join(errors[:20])
