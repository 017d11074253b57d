"""`causaldim compare`: one report across finished runs of the tiny model (two layers, two
seeds), every number read from their results.json; the refusals write nothing."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import snapshot
from test_pipeline import run_args

import causaldim
from causaldim import cli
from causaldim.fileio import write_sealed_json
from causaldim.measures.sigma import DIRECT
from causaldim.report.compare import compare, with_interval

SMALL = ["--widths", "16", "32", "64", "128", "--bootstrap", "20", "--ce-sequences", "0"]
RUNS = [(1, 0), (2, 0), (1, 1)]  # (layer, seed)


def _args(model, corpus, out, layer: int, seed: int) -> list[str]:
    return run_args(model, corpus, out) + SMALL + ["--layer", str(layer), "--seed", str(seed)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, text_corpus):
    """Three finished runs: layers 1 and 2 at seed 0, layer 1 at seed 1."""
    root = tmp_path_factory.mktemp("compare-runs")
    made = {}
    for layer, seed in RUNS:
        out = root / f"L{layer}-s{seed}"
        args = _args(tiny_model("llama"), text_corpus, out, layer, seed)
        assert cli.main(args) == 0
        made[layer, seed] = (out, args)
    return made


def _folders(runs) -> list:
    return [runs[key][0] for key in RUNS]


def test_the_table_holds_each_runs_numbers_as_its_results_json(runs, tmp_path):
    out = tmp_path / "cmp"
    written = compare(_folders(runs), out)
    data = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in data["runs"]] == ["L1-s0", "L2-s0", "L1-s1"]  # the folders
    assert data["differ"] == ["layer", "seed"] and data["profile_x"] == "layer"
    md = (out / "compare.md").read_text()
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| L")}
    for run, folder in zip(data["runs"], _folders(runs), strict=True):
        results = json.loads((folder / "results.json").read_text())
        assert run["path"] == str((folder / "results.json").resolve())
        assert run["layer"] == results["store"]["layer"] and run["seed"] == results["seed"]
        assert run["relative_depth"] == run["layer"] / 3
        a = results["sweep"][results["headline"]["architecture"]]
        assert run["epsilon"] == a["epsilon"] and run["wedge"]["width_ratio"] == 8
        assert [h["counts"] for h in run["atp_histograms"]] == [
            r["atp_histogram"]["counts"] for r in a["per_width"]
        ]
        row = rows[run["label"]]
        for reading in DIRECT:
            est = results["sigma"][reading]
            kept = run["sigma"][reading]
            assert kept["erank_corrected"] == est["erank_corrected"]
            assert kept["erank_corrected_95"] == est["erank_corrected_95"]
            lo, hi = est["erank_corrected_95"]  # d = 32: one decimal throughout
            cell = f"{est['erank_corrected']:.1f} [{lo:.1f}, {hi:.1f}]"
            assert f"| {cell}" in row  # then " |", or the not-converged note
        if a["estimable"]:
            assert run["kappa_hat"]["kappa"] == a["kappa"]["free"]["kappa"]
        else:
            assert "not estimable" in row and a["not_estimable"] in md
    for name in ("compare_kappa", "compare_wedge", "compare_atp"):
        assert (out / "figures" / f"{name}.png").stat().st_size > 10_000
        assert f"![{name}](figures/{name}.png)" in md
    assert not (out / "figures" / "compare_profile.png").exists()
    assert "No run has a profile" in md
    assert (out / "compare.html").read_text().count("data:image/png;base64,") == 3
    assert sorted(written) == sorted(p for p in out.rglob("*") if p.is_file())


def test_the_cli_prints_what_it_wrote_and_comparing_is_deterministic(runs, tmp_path, capsys):
    folders = [str(f) for f in _folders(runs)]
    first, second = tmp_path / "a", tmp_path / "b"
    capsys.readouterr()
    assert cli.main(["compare", *folders, "--out", str(first)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed and all(line.startswith("wrote: ") for line in printed)
    assert sorted(line[7:] for line in printed) == sorted(
        str(p) for p in first.rglob("*") if p.is_file()
    )
    before = (first / "compare.json").read_bytes()
    assert cli.main(["compare", *folders, "--out", str(first)]) == 0  # its own files: overwritten
    assert (first / "compare.json").read_bytes() == before
    # results.json paths work as well as folders
    paths = [str(f / "results.json") for f in _folders(runs)]
    assert cli.main(["compare", *paths, "--out", str(second)]) == 0
    assert (second / "compare.json").read_bytes() == before
    # and from Python, the same comparison
    written = causaldim.compare(_folders(runs), tmp_path / "c")
    assert (tmp_path / "c" / "compare.json") in written
    assert (tmp_path / "c" / "compare.json").read_bytes() == before


def _refused(capsys, root, argv, message):
    before = snapshot(root)
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert snapshot(root) == before


def test_refusals_write_nothing(runs, tmp_path, capsys):
    a, b, _ = _folders(runs)
    root = a.parent
    out = tmp_path / "cmp"
    _refused(capsys, root, ["compare", str(a), "--out", str(out)], "at least 2 runs, got 1")
    empty = tmp_path / "unfinished"
    empty.mkdir()
    _refused(capsys, root, ["compare", str(a), str(empty), "--out", str(out)], "no results.json")
    _refused(capsys, root, ["compare", str(a), str(a), "--out", str(out)], "are the same run")
    _refused(capsys, root, ["compare", str(a), str(b), "--out", str(a)], "is the folder of the run")
    assert not out.exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    (busy / "compare.md").write_text("an earlier comparison\n")
    _refused(capsys, tmp_path, ["compare", str(a), str(b), "--out", str(busy)], "notes.txt")
    _refused(capsys, root, ["compare", str(a), str(b), "--out", str(root)], "not a comparison")


def test_runs_of_another_schema_are_refused_naming_both(runs, tmp_path, capsys):
    a, b, _ = _folders(runs)
    old = json.loads((b / "results.json").read_text())
    old["schema"] = "causaldim.results/2"
    (tmp_path / "old").mkdir()
    write_sealed_json(tmp_path / "old" / "results.json", old)
    out = tmp_path / "cmp"
    argv = ["compare", str(a), str(tmp_path / "old"), "--out", str(out)]
    _refused(capsys, tmp_path, argv, "causaldim.results/2")
    before = snapshot(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "causaldim.results/5" in err and "re-run or re-render the older one" in err
    assert str(tmp_path / "old" / "results.json") in err
    assert snapshot(tmp_path) == before and not out.exists()


def test_profiles_are_overlaid_over_depth(runs, tmp_path):
    """--profile on copies of the layer-1 and layer-2 runs (store and SAEs reused): both
    profiles drawn over the layer; a model that differs puts them on relative depth."""
    copies = []
    for key in ((1, 0), (2, 0)):
        folder, args = runs[key]
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy)
        args = list(args)
        args[args.index("--out") + 1] = str(copy)
        assert cli.main([*args, "--profile"]) == 0
        copies.append(copy)
    out = tmp_path / "cmp"
    compare([*copies, runs[1, 1][0]], out)
    data = json.loads((out / "compare.json").read_text())
    profiled = [r for r in data["runs"] if r["profile"]]
    assert [r["label"] for r in profiled] == ["L1-s0", "L2-s0"]
    for run, copy in zip(profiled, copies, strict=True):
        prof = json.loads((copy / "results.json").read_text())["profile"]
        assert [row["layer"] for row in run["profile"]["layers"]] == [0, 1, 2, 3]
        assert (
            run["profile"]["layers"][2]["readings"]["logits"]["erank_corrected"]
            == (prof["layers"]["2"]["logits"]["erank_corrected"])
        )
    assert (out / "figures" / "compare_profile.png").stat().st_size > 10_000
    md = (out / "compare.md").read_text()
    assert "Runs with a profile: L1-s0, L2-s0; without (not drawn): L1-s1; x: layer." in md
    # another model (faked by renaming one run's and giving it 6 layers): relative depth
    results = json.loads((copies[1] / "results.json").read_text())
    results["inputs"]["model"]["name"] = "other"
    results["store"]["model"]["n_layers"] = 6
    write_sealed_json(copies[1] / "results.json", results)
    compare(copies, out)  # over the earlier comparison: its own files only
    data = json.loads((out / "compare.json").read_text())
    assert data["profile_x"] == "relative_depth" and data["differ"][0] == "model"
    assert [r["label"] for r in data["runs"]] == ["L1-s0", "L2-s0"]
    assert data["runs"][1]["profile"]["layers"][3]["relative_depth"] == pytest.approx(3 / 5)
    assert "layer / (n_layers - 1), as the models differ" in (out / "compare.md").read_text()
    # a comparison without profiles over it: the earlier profile figure goes with it
    compare(_folders(runs), out)
    assert not (out / "figures" / "compare_profile.png").exists()


def test_an_estimable_kappa_hat_is_shown_with_its_interval(runs, tmp_path):
    """The tiny random model's N_causal does not grow, so no run here has a kappa_hat: one
    run's sweep is marked estimable in a copy to show the other branch."""
    folders = []
    for key in ((1, 0), (2, 0)):
        results = json.loads((runs[key][0] / "results.json").read_text())
        folder = tmp_path / runs[key][0].name
        folder.mkdir()
        if key == (2, 0):
            a = results["sweep"]["topk"]
            a["estimable"], a["not_estimable"] = True, None
            free = a["kappa"]["free"]
        write_sealed_json(folder / "results.json", results)
        folders.append(folder)
    out = tmp_path / "cmp"
    compare(folders, out)
    data = json.loads((out / "compare.json").read_text())
    shown = data["runs"][1]["kappa_hat"]
    assert [r["label"] for r in data["runs"]] == ["L1-s0", "L2-s0"]
    assert shown["kappa"] == free["kappa"] and shown["interval_95"] == free["interval_95"]
    md = (out / "compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| L2-s0 |"))
    assert f"| {with_interval(free['kappa'], free['interval_95'])} |" in row
    assert data["runs"][0]["kappa_hat"]["kappa"] is None and "L1-s0: kappa_hat not" in md


def test_compare_neither_draws_nor_tabulates_what_a_run_gives_as_na(runs, tmp_path, recwarn):
    """A reading below the floor of independent equivalents is n/a in its run's report:
    n/a in the comparison too, in compare.json, the table and the figure's data; one not
    converged is marked."""
    folders = []
    for key, floor in (((1, 0), True), ((2, 0), False)):
        results = json.loads((runs[key][0] / "results.json").read_text())
        est = results["sigma"]["logits"]
        d = results["store"]["model"]["d_model"]
        if floor:  # 0.5 independent equivalents per dimension: the run prints n/a
            est.update(n_independent=0.5 * d, converged=False)
        else:
            est.update(n_independent=3.0 * d, converged=False)
        folder = tmp_path / runs[key][0].name
        folder.mkdir()
        write_sealed_json(folder / "results.json", results)
        folders.append(folder)
    out = tmp_path / "cmp"
    compare(folders, out)
    data = json.loads((out / "compare.json").read_text())
    below, above = (r["sigma"]["logits"] for r in data["runs"])
    assert below["below_floor"] and below["erank_corrected"] is None
    assert below["erank_corrected_95"] is None
    assert not above["below_floor"] and above["erank_corrected"] is not None
    md = (out / "compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| L1-s0 |"))
    assert "n/a (below the floor)" in row
    assert "(not converged" in next(
        line for line in md.splitlines() if line.startswith("| L2-s0 |")
    )
    assert not [w for w in recwarn if "tight_layout" in str(w.message)]
    assert (out / "figures" / "compare_kappa.png").stat().st_size > 10_000


def test_a_json_that_is_not_a_run_is_named_as_such(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text("{}")
    assert cli.main(["compare", str(run), str(other), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "is not a causaldim results file" in err and "has no results.json" not in err
