"""notebooks/quickstart.ipynb runs as written: its code cells, in order, in one namespace
(the smoke preset on the embedded model, so slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import seed_store

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs(smoke_run, tmp_path, monkeypatch):
    """Its run starts from the store of the session's smoke run (conftest.smoke_run, the
    same harvest), put in its folder: everything after the harvest runs as written."""
    monkeypatch.chdir(tmp_path)  # its runs/ go here
    seed_store(smoke_run[0], tmp_path / "runs" / "notebook-smoke")
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    namespace: dict = {}
    for cell in cells:
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), str(NOTEBOOK), "exec"), namespace)
    res = namespace["res"]
    assert (tmp_path / "runs" / "notebook-smoke" / "tables" / "sigma.csv").is_file()
    k = res.kappa  # below the report's floor (a smoke run's few eval tokens) no value
    assert res.model == "smollm2-135m"
    assert (k.value is None and k.plug_in > 0) or k.low <= k.value <= k.high
