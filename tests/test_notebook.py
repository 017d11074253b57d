"""notebooks/quickstart.ipynb runs as written: its code cells, in order, in one namespace
(the smoke preset on the embedded model, so slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its runs/ go here
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    res = namespace["res"]
    assert (tmp_path / "runs" / "notebook-smoke" / "tables" / "sigma.csv").is_file()
    assert res.model == "smollm2-135m" and res.kappa.low <= res.kappa.value <= res.kappa.high
