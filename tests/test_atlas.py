"""causaldim atlas: a grid of cells, each one eval pass with every layer under both outlier
rules; finished cells reused, a lost one made again to the same numbers."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import make_text

from causaldim import cli
from causaldim.fileio import read_sealed_json


@pytest.fixture(scope="module")
def atlas_run(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("atlas")
    corpora = []
    for seed in (1, 2):
        path = root / f"text{seed}.txt"
        path.write_text(make_text(3000, seed))
        corpora.append(str(path))
    out = root / "atlas"
    args = ["--quiet", "atlas", "--models", tiny_model("llama"), tiny_model("gemma3")]
    args += ["--corpora", *corpora, "--seq-lens", "16", "--eval-tokens", "128"]
    args += ["--profile-blocks", "4", "--out", str(out)]
    assert cli.main(args) == 0
    return out, args


def test_every_cell_layer_rule_and_reading_is_a_row(atlas_run):
    out, _ = atlas_run
    cells = sorted((out / "cells").glob("*.json"))
    assert len(cells) == 2 * 2
    rows = list(csv.DictReader((out / "atlas.csv").open()))
    readings = {"loss", "logits", "logits_uncentred", "fisher"}
    assert {r["reading"] for r in rows} == readings
    assert {r["outliers"] for r in rows} == {"left out", "kept"}
    assert len(rows) == 4 * 4 * 2 * len(readings)  # cells x layers x rules x readings
    for r in rows:
        assert 0.0 <= float(r["depth"]) <= 1.0
        if r["kappa"]:
            assert float(r["low"]) <= float(r["kappa"]) <= float(r["high"])
        else:  # below the floor: no value, the tokens that would do
            assert r["converged"] == "False" and int(r["eval_tokens_needed"]) > 0
    for path in cells:  # the plan made as the cell began, beside what it measured
        cell = read_sealed_json(path, "cell")
        assert cell["planned"]["seconds"] > 0 and cell["planned"]["memory_bytes"] > 0
        assert cell["memory"]["peak"] >= cell["memory"]["in_use_before"] > 0
    md = (out / "atlas.md").read_text()
    assert "causaldim atlas --models" in md and "## What moves kappa" in md
    assert "minutes: planned, measured" in md
    assert (out / "atlas.png").stat().st_size > 10_000


def test_a_rerun_reuses_cells_and_a_lost_one_comes_back_the_same(atlas_run):
    out, args = atlas_run
    cells = sorted((out / "cells").glob("*.json"))
    stamps = {p: p.stat().st_mtime_ns for p in cells}
    lost = cells[2]
    before = read_sealed_json(lost, "cell")
    lost.unlink()
    assert cli.main([*args, "--max-minutes", "0"]) == 0  # only what is finished: written
    assert not lost.exists()
    md = (out / "atlas.md").read_text()
    assert "Not yet measured (1 of the grid's 4 cells; --max-minutes ended" in md
    assert lost.stem in md and "--max-minutes 0" in md
    assert cli.main(args) == 0
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items() if p != lost)
    again = read_sealed_json(lost, "cell")
    assert json.dumps(again["layers"], sort_keys=True) == json.dumps(
        before["layers"], sort_keys=True
    )


def test_bad_grids_are_refused_before_any_pass(tmp_path, capsys):
    out = tmp_path / "a"
    for bad in (
        ["--seq-lens", "16", "16"],
        ["--eval-tokens", "0"],
        ["--models", "no/such-model-x"],
    ):
        assert cli.main(["atlas", *bad, "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip().count("\n") == 0
    assert not out.exists()


def test_the_atlas_answers_the_claims_by_the_claims_tables_rules(atlas_run):
    out, _ = atlas_run
    md = (out / "atlas.md").read_text()
    table = md.split("## The claims it answers")[1]
    assert (
        "| kappa_text, sequences of 16 |" in table and "| kappa_scale, sequences of 16 |" in table
    )
    assert "across families" in table or "not testable" in table or "not converged" in table
    verdicts = [line.split(" | ")[2] for line in table.splitlines() if line.startswith("| kappa_")]
    assert verdicts and all(v in ("holds", "does not hold", "not testable here") for v in verdicts)
