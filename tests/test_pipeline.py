"""`causaldim run` end to end on a tiny model: results.json, the report, re-rendering,
presets and the dry run, and the refusals specific to the sweep and its analysis."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import gemma_scope_npz, snapshot

import causaldim
from causaldim import cli
from causaldim.errors import UsageError
from causaldim.measures.sigma import DIRECT
from causaldim.presets import PRESETS, preset_configs


def run_args(model: str, corpus, out) -> list[str]:
    return [
        "--quiet",
        "run",
        "--model",
        model,
        "--corpus",
        str(corpus),
        "--tokens",
        "4096",
        "--seq-len",
        "32",
        "--eval-fraction",
        "0.25",
        "--widths",
        "16",
        "32",
        "64",
        "128",
        "256",
        "--k",
        "4",
        "--epochs",
        "2",
        "--batch-tokens",
        "256",
        "--bootstrap",
        "30",
        "--blocks",
        "8",
        "--ce-sequences",
        "2",
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("pipeline") / "run"
    args = run_args(tiny_model("llama"), text_corpus, out)
    assert cli.main(args) == 0
    return out, args


def test_results_hold_every_number_of_the_report(finished_run):
    out, _ = finished_run
    r = json.loads((out / "results.json").read_text())
    assert r["schema"] == "causaldim.results/5" and r["headline"]["architecture"] == "topk"
    a = r["sweep"]["topk"]
    assert [row["width"] for row in a["per_width"]] == [16, 32, 64, 128, 256]
    for row in a["per_width"]:
        for key in ("n_repr", "n_causal", "l0", "fraction_variance_explained", "dead_fraction"):
            assert row[key] is not None
        assert 2 < row["l0"] <= 4 and row["n_repr"] <= row["width"]
        assert len(row["n_causal_95"]) == 2 and row["ce_loss_recovered"] is not None
    # By calibration: of 16 features only the largest lies above their 98th percentile.
    assert a["per_width"][0]["n_causal"] == 1
    assert a["epsilon"] > 0 and len(a["epsilon_95"]) == 2
    assert a["wedge"]["width_ratio"] == 16 and a["wedge"]["n_repr_growth"] > 1
    for name in ("free", "at_most_d"):
        k = a["kappa"][name]
        assert k["form"] in ("exponential", "hyperbolic", "lomax")
        assert len(k["interval_95"]) == 2 and set(k["fits"]) == {
            "exponential",
            "hyperbolic",
            "lomax",
        }
        assert k["kappa_over_d"] == pytest.approx(k["kappa"] / 32)
        assert "coverage" in k and "width_95" in k
    assert a["kappa"]["at_most_d"]["kappa"] <= 32
    assert set(r["sigma"]) == {*DIRECT, "activations"}
    for reading, est in r["sigma"].items():
        assert 1 <= est["erank"] <= 32
        if reading == "activations":  # a plug-in reference line, not corrected
            assert est["erank_corrected"] is None
            continue
        lo, hi = est["erank_corrected_95"]
        assert 1 <= est["erank_corrected"] <= 32 and lo <= est["erank_corrected"] <= hi
        assert isinstance(est["converged"], bool) and est["n_independent"] <= est["n_eff"]
    assert r["direct_kappa"]["value"] == r["sigma"]["logits"]["erank_corrected"]
    twin = r["sigma"]["logits"]["activation_weighted"]
    assert r["direct_kappa"]["activation_weighted"]["value"] == twin["erank_corrected"]
    assert r["weights"]["d_model"] == 32 and set(r["weights"]["layers"]) == {"0", "1", "2", "3"}
    lad = r["ladder"]
    assert lad["layer"] == r["store"]["layer"] and lad["k"] == [0, 8, 16, 32]
    assert lad["eranks"] == {
        "raw": r["sigma"]["logits"]["erank_corrected"],
        "act": twin["erank_corrected"],
    }
    assert r["seconds"]["total"] > 0 and r["versions"]["torch"]
    assert r["inputs"]["store"]["manifest_sha256"] and r["inputs"]["corpus"]["sha256"]
    assert r["paper"]["kappa_hat"] == 1990 and r["config"]["sweep"]["k"] == 4


def test_the_report_renders_and_re_renders_from_results_alone(finished_run, capsys):
    out, _ = finished_run
    md = (out / "report.md").read_text()
    for text in ("kappa_hat", "Beside the paper", "N_causal", "Direct Sigma", "![wedge_topk]"):
        assert text in md
    page = (out / "report.html").read_text()
    # sigma, wedge, AtP, subspace and the ladder of directions kept, inlined
    assert page.count("data:image/png;base64,") == 5
    assert "## Which directions matter, by intervention" in md
    for name in ("sigma.png", "wedge_topk.png", "atp_topk.png", "subspace.png", "ladder.png"):
        assert (out / "figures" / name).stat().st_size > 10_000
        (out / "figures" / name).unlink()
    (out / "report.md").unlink()
    assert cli.main(["report", str(out / "results.json")]) == 0
    assert (out / "report.md").read_text() == md
    assert (out / "figures" / "wedge_topk.png").is_file()
    assert "kappa_hat" in capsys.readouterr().out


def test_a_rerun_reuses_store_and_saes_and_gives_the_same_numbers(finished_run, capsys):
    out, args = finished_run
    before = json.loads((out / "results.json").read_text())
    assert cli.main(args) == 0
    after = json.loads((out / "results.json").read_text())
    assert after["store"]["reused"] and all(s["reused"] for s in after["saes"].values())
    assert after["sweep"] == before["sweep"] and after["sigma"] == before["sigma"]
    assert "wall time" in capsys.readouterr().out


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, tiny_model, text_corpus, capsys):
    out = tmp_path / "out"
    args = run_args(tiny_model("llama"), text_corpus, out)
    before = snapshot(tmp_path)
    assert cli.main([*args, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    for text in ("tokens: 3,072 train, 1,024 eval", "disk: store", "time, rough", "nothing"):
        assert text in printed
    assert snapshot(tmp_path) == before and not out.exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--widths", "64", "32", "128"], "--widths must be strictly increasing"),
        (["--reference-width", "48"], "--reference-width 48 is not among --widths"),
        (["--percentile", "100"], "--percentile must lie in (0, 100)"),
        (["--percentile", "0"], "--percentile must lie in (0, 100)"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--dead-tokens", "6144"], "--dead-tokens 6,144 is not below the 6,144 tokens"),
        (["--profile", "--profile-blocks", "1"], "--profile-blocks must be at least 2"),
    ],
)
def test_bad_sweep_and_analysis_input(tmp_path, tiny_model, text_corpus, capsys, flags, message):
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([*run_args(tiny_model("llama"), text_corpus, out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before and not out.exists()


def test_a_store_without_gradients_is_refused_for_scoring(finished_run, tmp_path, capsys):
    from causaldim.fileio import write_sealed_json

    out, args = finished_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (manifest,) = copy.glob("stores/L?-????????????/manifest.json")  # not the extension's
    m = json.loads(manifest.read_text())
    m["splits"]["eval"]["fields"] = [f for f in m["splits"]["eval"]["fields"] if f != "g"]
    write_sealed_json(manifest, m)  # a whole store, harvested without gradients
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main([*args[:-1], str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no gradients (g)" in err and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before


def test_results_of_another_schema_are_refused(finished_run, tmp_path, capsys):
    out, _ = finished_run
    old = json.loads((out / "results.json").read_text())
    old["schema"] = "causaldim.results/1"
    del old["sealed_sha256"]  # an older causaldim sealed nothing
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    (tmp_path / "report.md").write_text("an older report\n")
    before = snapshot(tmp_path)
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "schema causaldim.results/1" in err and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before


def test_presets_and_their_overrides():
    harvest, sweep, analysis = preset_configs("paper")
    assert (harvest.model, harvest.layer, harvest.seq_len) == ("google/gemma-2-2b", 12, 512)
    assert sweep.widths[0] == 16_384 and sweep.widths[-1] == 1_048_576
    default = preset_configs("default")[1]
    assert len(default.widths) >= 5 and default.widths[-1] / default.widths[0] >= 16
    smoke = preset_configs("smoke", k=4)[1]
    assert smoke.k == 4 and smoke.widths == PRESETS["smoke"]["widths"]
    with pytest.raises(UsageError, match="unknown setting"):
        preset_configs("smoke", not_a_field=1)


def test_controls_all_add_a_section_and_a_figure_each(tmp_path, tiny_model, text_corpus):
    from causaldim.config import CONTROLS

    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--controls", "all"]
    args += ["--ablation-features", "4", "--ablation-sequences", "2", "--task-prompts", "8"]
    assert cli.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["controls"]) == list(CONTROLS)
    assert set(results["sweep"]) == {"topk", "jumprelu", "relu"}  # 'architectures' adds them
    assert results["config"]["sweep"]["architectures"] == ["topk", "jumprelu", "relu"]
    assert results["seconds"]["controls"] > 0
    report = (out / "report.md").read_text()
    for name in (
        "Threshold robustness",
        "Architecture invariance",
        "Matched L0",
        "Four-cell encoder/decoder ablation",
        "Geometric privilege",
        "AtP against real ablation",
        "Synthetic ground truth",
        "Task-specific recovery",
        "Depth",
    ):
        assert f"### {name}" in report
    assert "Not run: needs a second model" in report  # no --scale-model given
    for name in ("thresholds", "architectures", "four_cell", "geometry", "ablation", "synthetic"):
        assert (out / "figures" / f"control_{name}.png").stat().st_size > 10_000
    c = results["controls"]
    assert [r["percentile"] for r in c["thresholds"]["rows"]] == [95.0, 98.0, 99.0, 99.5]
    assert len(c["l0"]["rows"]) == 15
    assert all(len(r["features"]) == 4 for r in c["ablation"]["rows"])
    assert c["depth"]["layers"] == [1, 2, 3] and c["task"]["width"] == 16
    assert abs(c["synthetic"]["direct"]["relative_error"]) < 0.02
    assert "### Nulls: untrained networks of the same shape" in report
    nulls = c["nulls"]["nulls"]
    assert set(nulls) == {"permuted", "init"}
    assert nulls["permuted"]["null"]["seed"] == results["seed"]
    assert nulls["init"]["model"].endswith(f":init@{results['seed']}")
    trained = c["nulls"]["trained"]["raw"]["value"]
    assert trained == results["sigma"]["logits"]["erank_corrected"]
    assert all(
        n["raw"]["n_tokens"] == c["nulls"]["trained"]["raw"]["n_tokens"] for n in nulls.values()
    )


def test_depth_and_scale_measure_other_layers_and_a_second_model(tmp_path, tiny_model, text_corpus):
    from causaldim.controls.scale import matched_layer

    out = tmp_path / "run"
    bigger = tiny_model("llama", n_layers=6, d=48)  # two random-init sizes of one family
    args = run_args(tiny_model("llama"), text_corpus, out)
    args += ["--controls", "depth", "scale", "--scale-model", bigger, "--widths", "16", "32", "64"]
    assert cli.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    depth, scale = results["controls"]["depth"], results["controls"]["scale"]
    # One pass wrote a store per layer; the headline layer's numbers are the headline's.
    assert depth["layers"] == [1, 2, 3]
    stores = sorted(p.name.rsplit("-", 1)[0] for p in (out / "stores").iterdir())
    # each layer's store, and its eval split's --headline-tokens extension
    assert stores == ["L1", "L1-headline", "L2", "L2-headline", "L3", "L3-headline"]
    row = {r["layer"]: r for r in depth["rows"]}
    assert row[2]["epsilon"] == results["sweep"]["topk"]["epsilon"]
    assert row[2]["erank"]["loss"] == results["sigma"]["loss"]["erank_corrected"]
    assert depth["epsilon_first_over_last"] == pytest.approx(row[1]["epsilon"] / row[3]["epsilon"])
    assert all(len(r["n_causal"]) == 3 for r in depth["rows"])
    assert scale["layers"] == [2, matched_layer(2, 4, 6)] and scale["d_model"] == [32, 48]
    assert [r["widths"] for r in scale["rows"]] == [[w, w] for w in (16, 32, 64)]
    assert all(0 <= r["ks"] <= 1 and 0 < r["p_value"] <= 1 for r in scale["rows"])
    assert (out / "scale" / "saes").is_dir() and (out / "depth" / "L1" / "saes").is_dir()


def test_scale_without_a_second_model_says_so(tmp_path, tiny_model, text_corpus):
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--controls", "scale"]
    assert cli.main(args + ["--widths", "16", "32", "--ce-sequences", "0"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "--scale-model" in results["controls"]["scale"]["skipped"]


def test_sae_files_replace_training(tmp_path, tiny_model, text_corpus, capsys):
    out = tmp_path / "run"
    paths = [gemma_scope_npz(tmp_path / f"w{m}.npz", 32, m, m) for m in (32, 16)]
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--sae-paths", *paths]
    assert cli.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["headline"]["architecture"] == "jumprelu" and list(results["sweep"]) == [
        "jumprelu"
    ]
    assert [r["width"] for r in results["sweep"]["jumprelu"]["per_width"]] == [16, 32]
    assert all(s["steps"] is None for s in results["saes"].values())  # nothing trained
    # The wrong residual width is refused before any work: nothing is written.
    wrong = gemma_scope_npz(tmp_path / "d48.npz", 48, 16, 0)
    capsys.readouterr()
    bad = run_args(tiny_model("llama"), text_corpus, tmp_path / "other") + ["--sae-paths", wrong]
    assert cli.main(bad) == 2
    assert "the SAE reads d = 48, layer 2" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_a_run_saves_each_readings_subspace_and_relates_every_sae(finished_run):
    out, _ = finished_run
    r = json.loads((out / "results.json").read_text())
    sub = r["subspace"]
    assert sub["reading"] == "logits" and set(sub["files"]) == set(DIRECT)
    d = r["store"]["model"]["d_model"]
    for reading, rel in sub["files"].items():
        saved = causaldim.load_subspace(out / rel)
        est = r["sigma"][reading]
        vectors = saved["eigenvectors"].double()
        assert vectors.shape == (d, d)
        assert torch.allclose(vectors.T @ vectors, torch.eye(d, dtype=torch.float64), atol=1e-4)
        assert saved["eigenvalues"].tolist() == pytest.approx(est["eigenvalues"])
        assert saved["eigenvalues_corrected"].tolist() == pytest.approx(
            est["eigenvalues_corrected"]
        )
        assert saved["directions_for"] == est["directions_for"] and saved["reading"] == reading
    assert 1 <= sub["k"] <= d
    rows = sub["saes"]["topk"]
    assert [row["width"] for row in rows] == [16, 32, 64, 128, 256]
    for row, per_width in zip(rows, r["sweep"]["topk"]["per_width"], strict=True):
        assert row["chance"] == pytest.approx(sub["k"] / d)
        assert row["n_causal"] == per_width["n_causal"]
        assert all(0.0 <= s <= 1.0 + 1e-6 for s in row["points"]["share"])
    assert (out / "figures" / "subspace.png").stat().st_size > 1000
    assert "## The causal subspace" in (out / "report.md").read_text()


def test_profile_measures_every_layer_beside_the_run(finished_run, tmp_path):
    """--profile on a finished run: the store is reused (the eval pass runs alone, tapping
    every block), every layer gets each reading, and at the run's layer the plug-in erank
    and n_eff equal the run's own (they do not depend on blocks or resamples)."""
    out, args = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    args = [*args[: args.index("--out")], "--out", str(copy), "--profile"]
    assert cli.main(args) == 0
    r = json.loads((copy / "results.json").read_text())
    assert r["store"]["reused"]
    prof = r["profile"]
    assert sorted(prof["layers"], key=int) == ["0", "1", "2", "3"] and prof["run_layer"] == 2
    here = prof["layers"]["2"]
    for reading, est in r["sigma"].items():
        assert here[reading]["erank"] == pytest.approx(est["erank"], rel=1e-5)
        assert here[reading]["n_eff"] == pytest.approx(est["n_eff"], rel=1e-5)
    for row in prof["layers"].values():
        for reading in ("loss", "logits", "fisher"):
            lo, hi = row[reading]["erank_corrected_95"]
            assert lo <= row[reading]["erank_corrected"] <= hi
    md = (copy / "report.md").read_text()
    assert "## Every layer" in md and "2 (run)" in md
    assert (copy / "figures" / "profile.png").stat().st_size > 10_000


def test_sae_seeds_carry_the_trainings_variance_into_the_report(finished_run, tmp_path):
    """--sae-seeds 2 on a finished run: the first training of each width is reused, a
    second is trained and scored, and every width shows both counts."""
    out, args = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    args = [*args[: args.index("--out")], "--out", str(copy), "--sae-seeds", "2"]
    assert cli.main(args) == 0
    r = json.loads((copy / "results.json").read_text())
    a = r["sweep"]["topk"]
    assert a["seeds"] == 2
    assert r["saes"]["topk-w16"]["reused"] and not r["saes"]["topk-w16-s1"]["reused"]
    for row in a["per_width"]:
        assert len(row["n_causal_seeds"]) == 2 and row["n_causal_seeds"][0] == row["n_causal"]
    assert "N_causal per seed" in (copy / "report.md").read_text()


def test_export_writes_saelens_folders_at_the_trained_hook(finished_run, tmp_path, capsys):
    from causaldim.sae.formats import load, load_any

    out, _ = finished_run
    layer = json.loads((out / "results.json").read_text())["store"]["layer"]
    one = out / "saes" / "topk-w64"
    assert cli.main(["export", str(one), str(tmp_path / "one"), "--format", "saelens"]) == 0
    cfg = json.loads((tmp_path / "one" / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == f"blocks.{layer}.hook_resid_post"
    x = torch.randn(50, 32)
    assert torch.equal(load_any(tmp_path / "one").encode(x), load(one).encode(x))
    # The whole sweep at once: one folder per SAE, named as in the run.
    assert cli.main(["export", str(out), str(tmp_path / "all")]) == 0
    names = sorted(p.name for p in (out / "saes").iterdir() if (p / "cfg.json").is_file())
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == names
    assert f"blocks.{layer}.hook_resid_post" in capsys.readouterr().out
    # An existing destination is refused in one line, and left as it was.
    before = snapshot(tmp_path / "one")
    assert cli.main(["export", str(one), str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists; export into a new folder" in err and "\n" not in err
    assert snapshot(tmp_path / "one") == before
    assert cli.main(["export", str(tmp_path / "nowhere"), str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_a_lighter_sweep_for_the_controls_own_saes_is_used_and_stated(
    tmp_path, tiny_model, text_corpus
):
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--widths", "16", "32", "64"]
    args += ["--controls", "architectures", "depth", "--control-epochs", "1"]
    args += ["--control-widths", "16", "32"]
    assert cli.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["sweep"]) == ["topk"]  # the headline's sweep is not widened
    archs, depth = results["controls"]["architectures"], results["controls"]["depth"]
    assert [r["architecture"] for r in archs["rows"]] == ["topk", "jumprelu", "relu"]
    for c in (archs, depth):
        assert c["control_sweep"] == {"widths": [16, 32], "epochs": 1}
    assert archs["widths"] == [16, 32] and depth["widths"] == [16, 32]
    assert sorted(p.name for p in (out / "architectures" / "saes").iterdir()) == [
        "jumprelu-w16",
        "jumprelu-w32",
        "relu-w16",
        "relu-w32",
        "topk-w16",
        "topk-w32",
    ]
    report = (out / "report.md").read_text()
    assert report.count("A lighter sweep than the headline's") == 2
    assert "trained 1 epoch(s) at widths 16 32" in report


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--control-epochs", "0"], "--control-epochs must be >= 1"),
        (["--control-widths", "16", "16"], "--control-widths must be distinct"),
    ],
)
def test_bad_control_sweeps_are_refused(tmp_path, tiny_model, text_corpus, capsys, flags, message):
    out = tmp_path / "run"
    assert cli.main(run_args(tiny_model("llama"), text_corpus, out) + flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_corpus_shorter_than_tokens_asks_is_said_not_passed_over(
    tmp_path, tiny_model, text_corpus, capsys
):
    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out) + ["--tokens", "100000000"]
    assert cli.main([*args, "--dry-run"]) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    assert "fewer than the 100,000,000 --tokens asks" in note and "the run uses them all" in note
    assert cli.main([*args, "--quiet"]) == 0
    assert note in capsys.readouterr().err  # the run says it before it starts


def test_every_warning_is_in_results_the_cli_the_report_and_the_api(
    tmp_path, tiny_model, text_corpus, capsys
):
    """A tiny run raises several (its N_causal does not grow, its corpus is shorter than
    --tokens asks, it is given a flag it does not read; its direct readings may not
    converge): each
    one, by code, in results.json, the CLI's output, the report's Read with care (which
    opens it) and Results.warnings; the unconverged headline flagged in each place."""
    import causaldim

    out = tmp_path / "run"
    args = run_args(tiny_model("llama"), text_corpus, out)
    args += ["--tokens", "100000000", "--task-prompts", "8"]  # the second: not read
    assert cli.main([*args, "--quiet"]) == 0
    printed = capsys.readouterr().out
    r = json.loads((out / "results.json").read_text())
    codes = [w["code"] for w in r["warnings"]]
    assert {"run.corpus_short", "run.unused.task_prompts", "sae.topk.not_estimable"} <= set(codes)
    assert len(set(codes)) == len(codes)
    assert all(w["severity"] in ("caution", "note") and w["message"] for w in r["warnings"])
    report = (out / "report.md").read_text()
    assert report.index("## Read with care") < report.index("## Headline")
    res = causaldim.load(out)
    assert res.warnings == r["warnings"]
    for w in r["warnings"]:
        words = f"{w['message'][:1].upper()}{w['message'][1:]}"
        assert f"{words} ({w['code']})" in printed, w["code"]  # the CLI, code after words
        assert f"- {words} (`{w['code']}`)" in report, w["code"]
    head = r["headline"]
    assert head["architecture"] == "topk" and head["reading"] == "logits"
    assert head["value"] == r["sigma"]["logits"]["erank_corrected"]
    assert set(head["warnings"]) <= set(codes)
    if head["converged"] is False:  # the tiny run's few tokens: flagged everywhere
        assert "direct.logits.not_converged" in head["warnings"]
        assert "not converged" in repr(res) and "not converged" in repr(res.kappa)
        assert "NO" in next(line for line in printed.splitlines() if line.startswith("logits "))
        assert "(not converged" in report.split("## Headline")[1].split("##")[0]


def test_the_run_says_what_it_runs_on_first(tmp_path, tiny_model, text_corpus, capsys):
    out = tmp_path / "run"
    args = [a for a in run_args(tiny_model("llama"), text_corpus, out) if a != "--quiet"]
    assert cli.main(args) == 0  # not --quiet, which leaves the line out with the bars
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("causaldim run (preset default): ") and " layer 2; corpus " in first
    r = json.loads((out / "results.json").read_text())
    tokens = r["store"]["tokens"]
    assert f"{tokens['train']:,} train and {tokens['eval']:,} eval tokens" in first


def test_dropping_weights_once_scored_gives_the_same_numbers(finished_run, tmp_path, capsys):
    """--drop-weights on a finished run's SAEs: the widths are spliced, scored and
    digested one at a time, then every SAE's weights but the reference's are deleted; the
    numbers are those of the run that kept them, and a re-run reuses what was kept."""
    out, args = finished_run
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    args = [*args[: args.index("--out")], "--out", str(copy)]
    assert cli.main([*args, "--drop-weights"]) == 0
    kept = json.loads((out / "results.json").read_text())
    dropped = json.loads((copy / "results.json").read_text())
    for key in ("sweep", "subspace", "sigma", "ce"):
        assert dropped[key] == kept[key], key
    weights = sorted(p.parent.name for p in (copy / "saes").glob("*/sae.safetensors"))
    assert weights == ["topk-w16"]  # the reference: the wider ones were compared with it
    assert [n for n, s in dropped["saes"].items() if s.get("weights_dropped")] == [
        f"topk-w{m}" for m in (32, 64, 128, 256)
    ]
    assert (
        "weights dropped once scored (--drop-weights): topk-w32, topk-w64"
        in (copy / "report.md").read_text()
    )
    # A re-run trains nothing: it reads the kept scores, digests and CE loss recovered.
    assert cli.main([*args, "--drop-weights"]) == 0
    again = json.loads((copy / "results.json").read_text())
    assert all(s["reused"] for s in again["saes"].values())
    assert again["sweep"] == kept["sweep"] and again["subspace"] == kept["subspace"]
    # Scores of another number of blocks cannot come from dropped weights: trained again.
    assert cli.main([*args, "--drop-weights", "--blocks", "4"]) == 0
    other = json.loads((copy / "results.json").read_text())
    retrained = [n for n, s in other["saes"].items() if not s["reused"]]
    assert retrained == [f"topk-w{m}" for m in (32, 64, 128, 256)]
    # Nothing reads dropped weights by accident: a run that needs them trains them again,
    # and an export of one says what happened to it.
    capsys.readouterr()
    assert cli.main(["export", str(copy / "saes" / "topk-w64"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "weights were dropped once it was scored (--drop-weights)" in err
    assert "\n" not in err and not (tmp_path / "x").exists()
    assert cli.main(args) == 0
    assert len(list((copy / "saes").glob("*/sae.safetensors"))) == 5


def test_dropping_weights_with_two_architectures_and_seeds(finished_run, tmp_path):
    """Each architecture keeps its own reference; every replicate is dropped, its scores
    still carrying the seeds' spread into the intervals."""
    out, args = finished_run
    extra = ["--architectures", "topk", "relu", "--sae-seeds", "2", "--widths", "16", "32", "64"]
    extra += ["--epochs", "1", "--bootstrap", "10"]
    runs = {}
    for name, drop in (("keep", []), ("drop", ["--drop-weights"])):
        copy = tmp_path / name
        shutil.copytree(out / "stores", copy / "stores")
        assert cli.main([*args[: args.index("--out")], "--out", str(copy), *extra, *drop]) == 0
        runs[name] = json.loads((copy / "results.json").read_text())
    for key in ("sweep", "subspace", "ce"):
        assert runs["drop"][key] == runs["keep"][key], key
    kept = sorted(p.parent.name for p in (tmp_path / "drop" / "saes").glob("*/sae.safetensors"))
    assert kept == ["relu-w16", "topk-w16"]
    assert len(runs["drop"]["saes"]) == 12 and runs["drop"]["sweep"]["relu"]["seeds"] == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--controls", "geometry"], "the control(s) geometry read them"),
        (["--sae-paths", "x"], "--sae-paths: x does not exist"),
    ],
)
def test_drop_weights_refuses_what_reads_weights(
    tmp_path, tiny_model, text_corpus, capsys, flags, message
):
    out = tmp_path / "out"
    assert (
        cli.main([*run_args(tiny_model("llama"), text_corpus, out), "--drop-weights", *flags]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()
