"""The Python API: measure() runs what `causaldim run` runs; load() reads it back as
numbers, tables, CSV files and an HTML display, all from results.json."""

from __future__ import annotations

import csv
import json

import pytest

import causaldim
from causaldim.errors import UsageError
from causaldim.fileio import write_sealed_json

TINY = dict(
    tokens=4096,
    seq_len=32,
    eval_fraction=0.25,
    widths=[16, 32, 64, 128],
    k=4,
    epochs=1,
    batch_tokens=256,
    bootstrap=20,
    blocks=8,
    ce_sequences=2,
)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("api") / "run"
    res = causaldim.measure(
        tiny_model("llama"), 1, corpus=str(text_corpus), out=str(out), progress=False, **TINY
    )
    return res, out


def test_measure_returns_the_runs_numbers(measured):
    res, out = measured
    raw = json.loads((out / "results.json").read_text())
    logits = raw["sigma"]["logits"]
    assert res.layer == 1 == raw["store"]["layer"]
    assert res.kappa[:3] == (logits["erank_corrected"], *logits["erank_corrected_95"])
    assert res.kappa.reading == "logits" and res.kappa.converged == logits["converged"]
    assert res.kappa.low <= res.kappa.value <= res.kappa.high
    twin = logits["activation_weighted"]  # the same samples in the activations' metric
    assert res.kappa_act[:3] == (twin["erank_corrected"], *twin["erank_corrected_95"])
    assert raw["direct_kappa"]["activation_weighted"]["value"] == twin["erank_corrected"]
    assert (
        res.direct("loss", "act").value
        == raw["sigma"]["loss"]["activation_weighted"]["erank_corrected"]
    )
    with pytest.raises(KeyError, match="no activation-weighted twin"):
        res.direct("activations", "act")
    a = raw["sweep"]["topk"]
    if a["estimable"]:
        assert res.kappa_hat.value == a["kappa"]["free"]["kappa"]
    else:
        assert res.kappa_hat is None and res.not_estimable == a["not_estimable"]
    assert "kappa_hat" in res.headline and "Direct kappa" in res.headline
    assert "layer 1" in repr(res)


def test_below_the_floor_kappa_has_no_value_as_the_report_prints_none(measured, tmp_path):
    """At 0.2 independent equivalents per dimension the report prints n/a: the API gives
    no value either, only the plug-in (which reads low) and the tokens that would do."""
    res, _ = measured
    data = json.loads(json.dumps(res.data))
    logits = data["sigma"]["logits"]
    d = logits["n_samples"] / logits["samples_per_dim"]
    logits.update(n_independent=0.2 * d, converged=False, eval_tokens_needed=12345)
    write_sealed_json(tmp_path / "results.json", data)
    k = causaldim.load(tmp_path).kappa
    assert k.value is None and k.low is None and k.plug_in == logits["erank"]
    assert k.converged is False and k.eval_tokens_needed == 12345
    assert "n/a" in repr(k) and "12,345" in repr(k)
    assert "kappa n/a (not converged" in repr(causaldim.load(tmp_path))


def test_load_reads_a_folder_or_its_results_json_alike(measured):
    res, out = measured
    for other in (causaldim.load(out), causaldim.load(out / "results.json")):
        assert other.data == res.data and other.path == out / "results.json"
    with pytest.raises(UsageError, match="does not exist"):
        causaldim.load(out / "nowhere")


def test_tables_as_dataframes_and_the_csvs_a_run_writes(measured, tmp_path):
    res, out = measured
    sigma = res.to_dataframe("sigma")
    raw = sigma[sigma["metric"] == "raw"]
    assert list(raw["reading"]) == list(res.data["sigma"])
    assert raw.set_index("reading").loc["logits", "erank"] == res.kappa.value
    act = sigma[sigma["metric"] == "act"].set_index("reading")
    assert act.loc["logits", "erank"] == res.kappa_act.value
    assert "activations" not in act.index
    widths = res.to_dataframe("widths")
    assert list(widths["width"]) == [16, 32, 64, 128]
    per_width = res.data["sweep"]["topk"]["per_width"]
    assert list(widths["n_causal"]) == [w["n_causal"] for w in per_width]
    assert res.table("profile") == []  # no --profile: no rows, and no CSV
    # The run wrote its tables beside results.json; to_csv writes the same elsewhere.
    written = res.to_csv(tmp_path)
    assert {p.name for p in written} == {p.name for p in (out / "tables").iterdir()}
    for path in written:
        assert path.read_text() == (out / "tables" / path.name).read_text()
    with (tmp_path / "widths.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["n_causal"]) for r in rows] == [w["n_causal"] for w in per_width]
    with pytest.raises(KeyError, match="choose one of"):
        res.table("nope")


def test_the_html_display_shows_the_headline_and_figures(measured):
    res, _ = measured
    page = res._repr_html_()
    assert "Direct kappa" in page and f"{res.kappa.value:,.1f}" in page
    assert "data:image/png;base64," in page and "<html" not in page
    assert set(res.figures) >= {"sigma", "wedge_topk"}


def test_bad_settings_are_refused_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="unknown setting"):
        causaldim.measure(out=str(tmp_path / "x"), tokenz=5)
    with pytest.raises(UsageError, match="must be"):
        causaldim.measure(out=str(tmp_path / "x"), tokens="many")
    assert not (tmp_path / "x").exists()


def test_a_misspelled_setting_gets_a_suggestion_and_errors_name_arguments(tmp_path):
    with pytest.raises(UsageError, match=r"'tokenz': did you mean 'tokens'\?"):
        causaldim.measure(out=str(tmp_path / "x"), tokenz=5)
    with pytest.raises(UsageError) as err:
        causaldim.measure(out=str(tmp_path / "x"), widths=[16, 32], k=20)
    assert "--" not in str(err.value) and "k must lie in 1..16" in str(err.value)
    assert not (tmp_path / "x").exists()


def test_python_names_turns_flags_into_arguments():
    from causaldim.api import python_names

    assert (
        python_names("--reference-width 4096 is not among --widths; pass one of them")
        == "reference_width 4096 is not among widths; pass one of them"
    )
    assert python_names("a-b --x") == "a-b x"


def test_dir_lists_the_public_api():
    names = set(dir(causaldim))
    assert set(causaldim.__all__) <= names
    assert {"measure", "load", "compare", "Results"} <= names
