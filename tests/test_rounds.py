"""--until-converged: eval rounds beyond --tokens until the headline converges or the cap,
each round reused by a rerun; and the direct readings with the other outlier choice."""

from __future__ import annotations

import json

import pytest
from test_pipeline import run_args

from causaldim import cli
from causaldim.config import AnalysisConfig
from causaldim.harvest.store import Store
from causaldim.measures import sigma


def _stores(out):
    return sorted(p.name for p in (out / "stores").iterdir())


@pytest.fixture(scope="module")
def rounds_run(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("rounds") / "run"
    args = [*run_args(tiny_model("llama"), text_corpus, out), "--until-converged"]
    args += ["--max-eval-tokens", "3072", "--target-width", "0.001", "--headline-tokens", "1024"]
    assert cli.main(args) == 0
    return out, args, json.loads((out / "results.json").read_text())


def test_rounds_harvest_beyond_the_run_up_to_the_cap(rounds_run):
    out, _, results = rounds_run
    uc = results["until_converged"]
    tokens = [r["eval_tokens"] for r in uc["rounds"]]
    # the first reading: the run's eval split and its --headline-tokens extension
    assert results["store"]["tokens"]["eval"] == 1024
    assert results["store"]["headline_extension"]["tokens"] == 1024
    assert tokens[0] == 2048
    assert tokens == sorted(tokens) and tokens[-1] == 3072  # a 0.1% interval: never narrow
    assert uc["stopped"] == "cap"
    # the run's store, its extension, and one per further round
    assert len(_stores(out)) == 1 + len(tokens)
    # the direct Sigma read every round; the SAEs' eval is the run's own
    logits = results["sigma"]["logits"]
    assert logits["n_tokens"] > 2 * 1024  # outliers (position 0) left out of 3,072
    assert logits["erank_corrected"] == pytest.approx(uc["rounds"][-1]["kappa"])
    # the report's header gives the tokens the headline read in the end
    head = (out / "report.md").read_text().split("## Headline")[0]
    assert f"the headline read {tokens[-1]:,} eval tokens over {len(tokens)} round(s)" in head


def test_a_rerun_reuses_every_round(rounds_run, capsys):
    out, args, results = rounds_run
    before = {p: (out / "stores" / p / "manifest.json").stat().st_mtime_ns for p in _stores(out)}
    capsys.readouterr()
    assert cli.main(args) == 0
    assert _stores(out) == sorted(before)
    after = {p: (out / "stores" / p / "manifest.json").stat().st_mtime_ns for p in before}
    assert after == before  # nothing harvested again
    again = json.loads((out / "results.json").read_text())
    assert again["until_converged"]["rounds"] == [
        {**r, "seconds": a["seconds"]}
        for r, a in zip(
            results["until_converged"]["rounds"], again["until_converged"]["rounds"], strict=True
        )
    ]


def test_rounds_read_as_one_eval_split(rounds_run):
    """Sums over [store, round, ...] are the sums of each part, added: the pooled reading
    holds every part's tokens."""
    out, _, _ = rounds_run
    stores = [Store(out / "stores" / p) for p in _stores(out)]
    main = next(s for s in stores if "eval_round" not in s.manifest["key"])
    parts = [
        main,
        *sorted(
            (s for s in stores if s is not main), key=lambda s: s.manifest["key"]["eval_round"]
        ),
    ]
    cfg = AnalysisConfig(blocks=4)
    pooled = sigma.accumulate(parts, cfg, ("logits",))["logits"]
    each = [sigma.accumulate(p, cfg, ("logits",))["logits"] for p in parts]
    assert float(pooled.n.sum()) == sum(float(e.n.sum()) for e in each)
    total = sum(e.xx.double().sum(0) for e in each)
    scale = float(total.abs().max())  # float32 products over blocks grouped otherwise
    assert float((pooled.xx.double().sum(0) - total).abs().max()) < 1e-5 * scale


def test_the_other_outlier_choice_is_measured_from_the_same_tokens(rounds_run):
    _, _, results = rounds_run
    other = results["sigma_other_outliers"]
    assert set(other) == {"loss", "logits", "logits_uncentred", "fisher"}
    assert other["logits"]["outliers"] == "kept"
    assert other["logits"]["n_tokens"] > results["sigma"]["logits"]["n_tokens"]  # position 0 in
    report = (rounds_run[0] / "report.md").read_text()
    assert "Outliers left out of Sigma" in report and "with them kept" in report
    assert "Until converged" in report and "--max-eval-tokens was reached" in report


@pytest.mark.parametrize(
    "extra",
    [
        ["--target-width", "0.02"],
        ["--until-converged", "--target-width", "1.5"],
        ["--until-converged", "--max-eval-tokens", "0"],
        ["--until-converged", "--logit-probes", "0"],
    ],
)
def test_bad_round_settings_are_refused_before_any_work(tmp_path, capsys, extra):
    assert cli.main(["run", "--out", str(tmp_path / "x"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and (
        "--target-width" in err or "--max-eval-tokens" in err or "--logit-probes" in err
    )
    assert not (tmp_path / "x").exists()
