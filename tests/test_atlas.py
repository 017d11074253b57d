"""causaldim atlas: a grid of cells, each one eval pass with every layer under both outlier
rules; finished cells reused, a lost one made again to the same numbers."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import make_text

from causaldim import cli
from causaldim.config import HarvestConfig
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
    args += ["--headline-tokens", "128", "--profile-blocks", "4", "--out", str(out)]
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
    # cells x layers x rules x (readings raw, and the headline activation-weighted)
    assert len(rows) == 4 * 4 * 2 * (len(readings) + 1)
    assert {r["reading"] for r in rows if r["metric"] == "act"} == {"logits"}
    assert all(float(r["later_gains_over_d"]) > 0 for r in rows)
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
        # the logits readings read the headline pass's tokens too; loss and Fisher do not
        assert cell["eval_tokens"] == cell["headline_tokens"] == 128
        kept = cell["layers"]["1"]["kept"]
        probes = HarvestConfig().logit_probes
        assert kept["logits"]["n_samples"] == 2 * 128 * probes
        assert kept["fisher"]["n_samples"] == 128 * HarvestConfig().fisher_probes
    md = (out / "atlas.md").read_text()
    assert "causaldim atlas --models" in md and "## What moves kappa, raw" in md
    assert "The paper's definition of kappa is the raw one" in md
    assert "## Which directions matter at the middle layer, by intervention" in md
    for path in cells:
        cell = read_sealed_json(path, "cell")
        assert cell["metrics"] == ["raw", "activation-weighted"]
        lad = cell["ladder"]
        assert lad["k"][-1] == cell["model"]["d_model"]
        assert all(c["kl"][-1] < 1e-5 for c in lad["rankings"].values())  # all d kept
    assert "minutes: planned, measured" in md
    if any(r["kappa"] for r in rows):  # model and depth said from the values there are
        assert "\n- model: kappa / d, the median over layers and cells, " in md
        assert "\n- depth, " in md
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
        ["--depths", "1.5"],
        ["--depths", "0.5", "0.5"],
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


def test_depths_measure_only_their_layers_to_the_whole_grids_numbers(atlas_run, tmp_path):
    out, args = atlas_run
    # a full atlas holds every layer: asking it for one depth measures nothing again
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")}
    assert cli.main([*args, "--depths", "0.5"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*.json")} == stamps
    # a new one at depths 0 and 0.5 measures those layers alone, to the same numbers
    alone = tmp_path / "alone"
    at = [*args[: args.index("--out")], "--out", str(alone), "--depths", "0.5", "0"]
    assert cli.main(at) == 0
    for path in (alone / "cells").glob("*.json"):
        cell = read_sealed_json(path, "cell")
        whole = read_sealed_json(out / "cells" / path.name, "cell")
        n = cell["model"]["n_layers"]
        assert cell["measured_layers"] == [0, round(0.5 * (n - 1))]
        assert sorted(cell["layers"], key=int) == [str(i) for i in cell["measured_layers"]]
        for layer, rules in cell["layers"].items():
            for rule, readings in rules.items():
                for reading, e in readings.items():
                    ref = whole["layers"][layer][rule][reading]
                    for key in ("erank", "erank_corrected", "n_independent"):
                        if ref[key] is None:
                            assert e[key] is None
                        else:
                            assert e[key] == pytest.approx(ref[key], rel=1e-5)
        # a cell's plan counts the sums of its own layers only (the work: the test below;
        # a tiny model's seconds are mostly the start's, timed here and noisy)
        assert cell["planned"]["memory_bytes"] < whole["planned"]["memory_bytes"]
    rows = list(csv.DictReader((alone / "atlas.csv").open()))
    assert {(r["model"], int(r["layer"])) for r in rows} == {
        (c["cell"]["model"], i)
        for c in (read_sealed_json(p, "cell") for p in (alone / "cells").glob("*.json"))
        for i in c["measured_layers"]
    }


def test_profile_layers_scale_the_sums_and_the_profiles_work(tiny_model, tmp_path):
    from causaldim import costs
    from causaldim.config import AnalysisConfig, HarvestConfig
    from causaldim.harvest.plan import plan
    from causaldim.sweep_config import SweepConfig

    the_plan = plan(
        HarvestConfig(model=tiny_model("llama"), tokens=1280, out=str(tmp_path / "run")),
        profile=True,
    )
    rates = costs.Rates(model=1e9, sae=2e9, eig=0.01, source="given")
    sweep, analysis = SweepConfig(widths=[16]), AnalysisConfig(profile=True)
    n = the_plan.source.n_layers
    every = costs.estimate(the_plan, sweep, analysis, rates)
    one = costs.estimate(the_plan, sweep, analysis, rates, profile_layers=(n - 1,))
    assert one["memory"]["profile_sums_bytes"] * n == every["memory"]["profile_sums_bytes"]
    assert one["seconds"]["profile"] * n == pytest.approx(every["seconds"]["profile"])
    # the forward pass for the activations' metric runs to the deepest tapped block
    assert 0 < every["seconds"]["metric_pass"] <= one["seconds"]["metric_pass"] * 1.0001
    # the eval pass's backwards stop at the top layer instead of block 0
    assert one["seconds"]["harvest_eval"] < every["seconds"]["harvest_eval"]
    plain = costs.estimate(the_plan, sweep, AnalysisConfig(), rates)
    assert "profile" not in plain["seconds"] and plain["memory"]["profile_sums_bytes"] == 0


def test_causaldim_claims_reads_an_atlas_beside_the_runs(atlas_run, tmp_path):
    from pathlib import Path

    out, _ = atlas_run
    run = Path(__file__).resolve().parents[1] / "docs" / "replicate"
    md_path = tmp_path / "claims.md"
    assert cli.main(["claims", str(run), str(out), "--out", str(md_path)]) == 0
    md = md_path.read_text()
    section = md.split(f"## Across the atlas: {out / 'atlas.json'}")[1]
    assert "causaldim atlas --models" in section
    assert "| kappa_text, sequences of 16 |" in section
    # the same rows as the atlas's own claims table
    own = (out / "atlas.md").read_text().split("## The claims it answers")[1]
    for line in own.splitlines():
        if line.startswith("| kappa_"):
            claim, verdict = line.split(" | ")[0], line.split(" | ")[2]
            assert claim in section and f"**{verdict}**" in section
