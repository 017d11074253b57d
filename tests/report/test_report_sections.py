"""The report's text from hand-made results dicts (no model, store or training): every section
formats the numbers results.json holds, the rare branches included, and render() writes
report.md, report.html and the figures from a results.json alone."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import pytest
from results_factory import (
    CODES,
    PNG,
    WARNINGS,
    D,
    architecture,
    lines_with,
    make_results,
    sigma_estimate,
    text,
    with_warnings,
)

from causaldim import __version__
from causaldim.claims.conditions import conditions_lines
from causaldim.errors import IntegrityError, UsageError
from causaldim.fileio import write_sealed_json
from causaldim.fmt import ci, features, growth, num, pct, sci
from causaldim.paper import PAPER
from causaldim.report.direct import direct_sigma, sigma_table
from causaldim.report.doc import Doc
from causaldim.report.figures import plot_atp, plot_sigma, plot_wedge
from causaldim.report.render import figure_plan, render
from causaldim.report.results import SCHEMA, load_results
from causaldim.report.sections import (
    beside_paper,
    build_report,
    headline,
    provenance,
    summary,
    title,
    title_text,
)
from causaldim.report.sweep_sections import sweeps


def test_fmt_writes_numbers_as_documented_and_missing_values_as_na():
    assert [num(None), num(math.nan), pct(None), pct(math.nan)] == ["n/a"] * 4
    assert [num(7), num(1234), num(1234.56), num(12.34), num(0.81234, 3)] == [
        "7",
        "1,234",
        "1,235",
        "12.3",
        "0.812",
    ]
    assert num(123.456, 2) == "123.46"  # digits > 1 keep the decimals above 100
    assert pct(0.1234) == "12.3%"
    assert [ci(None), ci([]), ci([math.nan, 5.0])] == ["[n/a]"] * 3
    assert ci([1234.4, 5678.9]) == "[1,234, 5,679]"
    assert [sci(None), sci([])] == ["[n/a]"] * 2
    assert sci([1.2345e-5, 2e-5]) == "[1.23e-05, 2e-05]"
    assert growth(None) == "n/a" and growth(2.3456) == "x2.35"
    assert [features(None), features(0.2), features(9880.4), features(math.inf)] == [
        "n/a",
        "< 1 feature",
        "9,880 features",
        "never",
    ]


def test_doc_markdown_writes_each_block(tmp_path):
    fig = tmp_path / "figures" / "f.png"
    fig.parent.mkdir()
    fig.write_bytes(PNG)
    doc = Doc()
    doc.h(2, "Section")
    doc.p("A paragraph.")
    doc.ul([])  # an empty list adds no block
    doc.ul(["one", "two"])
    doc.table(["a", "b"], [[1, 2.5], ["x", None]])
    doc.img(fig, "the figure")
    assert len(doc.blocks) == 5
    assert doc.markdown(tmp_path) == (
        "## Section\n\nA paragraph.\n\n- one\n- two\n\n"
        "| a | b |\n| --- | --- |\n| 1 | 2.5 |\n| x | None |\n\n"
        "![the figure](figures/f.png)\n"
    )


def test_doc_html_escapes_text_and_inlines_images(tmp_path):
    fig = tmp_path / "f.png"
    fig.write_bytes(PNG + b"rest")
    doc = Doc()
    doc.h(1, "A & B")
    doc.p("kappa <= d & <b>bold</b>")
    doc.ul(["x > y"])
    doc.table(["<th>"], [["a&b"]])
    doc.img(fig, "alt 'q' <")
    page = doc.html("title <&>")
    assert page.startswith("<!doctype html>") and page.endswith("</body></html>\n")
    assert "<title>title &lt;&amp;&gt;</title>" in page
    assert "<h1 id='a--b'>A &amp; B</h1>" in page
    assert "<p>kappa &lt;= d &amp; &lt;b&gt;bold&lt;/b&gt;</p>" in page
    assert "<b>" not in page
    assert "<ul><li>x &gt; y</li></ul>" in page
    assert "<table><tr><th>&lt;th&gt;</th></tr><tr><td>a&amp;b</td></tr></table>" in page
    assert "alt='alt &#x27;q&#x27; &lt;'" in page
    assert f"src='data:image/png;base64,{base64.b64encode(fig.read_bytes()).decode()}'" in page


# ----------------------------------------------------------------------------- the sections


def test_title_states_the_model_the_store_and_the_run():
    assert title_text(make_results()) == "Causal dimensionality of smollm2-135m, layer 15"
    md = text(title, results=make_results())
    assert (
        "Residual stream at the output of block 15 (model.layers[15]), named elsewhere "
        "TransformerLens/SAELens blocks.15.hook_resid_post = blocks.16.hook_resid_pre, Hugging "
        "Face hidden_states[16], sparsify layers.15, Gemma Scope layer_15; d = 576; corpus: "
        "builtin-py3.11; 57,344 train and 8,192 eval tokens in sequences of 128; outliers left "
        "out: 1,234 tokens (512 at position 0 of their sequence, 722 by norm), carrying 45.7% "
        "of the residual variance. Preset default, seed 7, "
        f"causaldim {__version__}, 612 s (10.2 min) in all."
    ) in md
    r = make_results()
    r["inputs"]["model"]["description"] = "SmolLM2-135M-Instruct, GGUF Q4_1 de-quantised"
    r["inputs"]["corpus"]["description"] = "docstrings of the Python 3.11 standard library"
    md = text(title, results=r)
    assert md.startswith("SmolLM2-135M-Instruct, GGUF Q4_1 de-quantised. Residual stream at")
    assert "; corpus: docstrings of the Python 3.11 standard library; " in md


def test_headline_quotes_the_fits_the_direct_estimates_and_the_wedge():
    md = text(headline, results=make_results())
    assert "## Headline" in md
    assert (
        "- SAE estimate (topk, hyperbolic fit chosen by AICc): kappa_hat = 433, 95% bootstrap "
        "interval [311, 698]; kappa_hat / d = 0.75; coverage at the widest SAE "
        "N_causal(m_max) / kappa_hat = 69.6%; 95% of kappa_hat is reached at a width of 9,880 "
        "features."
    ) in md
    assert "- Constrained to kappa <= d: kappa_hat = 433 [311, 576] (hyperbolic)." in md
    assert md.index("Direct kappa") < md.index("SAE estimate")  # the direct one leads
    assert (
        "- Direct kappa = erank(E[J^T (I - 11^T/V) J]) (the logits reading, each probe "
        "centred over the vocabulary; J pulled back through every later position, as AtP's "
        "gradient is), from 8,192 eval tokens: 258 [242, 275], 0.45 d, corrected for finite "
        "samples (95%: sequences, simulation and remaining drift); converged, 5,184 "
        "independent equivalents (9.0 per dimension; n_eff 2,048); participation ratio 94.7 "
        "[87, 103]."
    ) in md
    assert (
        "- The paper's literal erank(E[J^T J]) (uncentred probes): 148 [132, 165]; 50.0% of "
        "its trace lies along the shift of all logits"
    ) in md
    assert (
        "- Beside it, the loss reading, erank(E[g g^T]), g = dLoss/dh, from 8,192 eval tokens: "
        "136 [121, 145], participation ratio 54.7."
    ) in md
    assert (
        "- Beside it, the fisher reading, erank(E[J^T (diag p - p p^T) J]), from 8,192 eval "
        "tokens: 232 [219, 253]"
    ) in md
    assert (
        "- Plug-in eranks (biased low by finite samples): loss 123, logits 234, "
        "logits_uncentred 134, fisher 211."
    ) in md
    assert "activations" not in md  # a reference, not an estimate
    assert (
        "- The wedge over x4 in width: N_repr grows x3.78 (log-log slope 0.96), N_causal "
        "x7.34 [5.90, 8.80] (log-log slope 1.44); at the widest SAE 92.1% of firing features "
        "fall below epsilon. With AtP averaged over the firing tokens (features with 1+ eval "
        "firings) instead of the all tokens, N_causal grows x7.34 (82 -> 234 -> 602)."
    ) in md
    assert "kappa_SAE" not in md and "v v^T" not in md  # a plug-in: not in the headline


def test_read_with_care_opens_the_report_with_every_warning():
    results = make_results()
    md = build_report(results, {}).markdown(Path("/"))
    assert md.index("## Read with care") < md.index("## Headline")
    for code, w in zip(CODES, WARNINGS, strict=True):
        assert f"- Topk: {w} (`sae.topk.{code}`)" in md
    assert results["headline"]["warnings"] == [f"sae.topk.{c}" for c in CODES]
    results["sweep"]["topk"]["cautions"] = []
    with_warnings(results)
    md = build_report(results, {}).markdown(Path("/"))
    assert "Read with care" not in md and results["warnings"] == []


def test_the_first_screen_leads_with_kappa_then_the_claims_then_cautions_then_provenance():
    results = make_results()
    results["sigma"]["logits"].update(converged=False, n_independent=3.0 * D)
    results["sigma"]["logits"]["eval_tokens_needed"] = 40_000
    results["sigma"]["logits"]["cautions"] = [["not_converged", "not converged: more tokens"]]
    with_warnings(results)
    md = build_report(results, {}).markdown(Path("/"))
    kappa = md.index("- **kappa of layer 15**")
    claims_a = md.index("- Claims about kappa, decided by the direct estimate:")
    claims_b = md.index("- Claims about the SAE estimator, set against the direct kappa:")
    cautions = md.index("## Read with care")
    provenance = md.index("Residual stream at the")
    assert md.index("# Causal dimensionality") < kappa < claims_a < claims_b < cautions
    assert cautions < provenance < md.index("## Headline")
    first = md[kappa : md.index("\n", kappa)]
    assert "NOT converged (3.0 per dimension; about 40,000 eval tokens would do)" in first
    assert ", converged (" not in first
    assert "(#a-claims-about-kappa-decided-by-the-direct-estimate)" in md
    assert "### A. Claims about kappa, decided by the direct estimate" in md
    # the first caution is the one that touches the headline's number
    listed = md[cautions:].split("\n- ")[1]
    assert "direct.logits.not_converged" in listed
    html = build_report(results, {}).html("t")
    assert "id='a-claims-about-kappa-decided-by-the-direct-estimate'" in html


def test_beside_paper_sets_each_number_of_the_run_beside_the_papers():
    md = text(beside_paper, results=make_results())
    assert "## Beside the paper" in md
    assert f"The paper: {PAPER['source']} (d = 2,304, x64 in width)." in md
    assert "| quantity | this run | paper |" in md
    for row in (
        "| width ratio of the sweep | x4 | x64 |",
        "| N_repr growth | x3.78 | x15.6 |",
        "| reference width / d | 1.78 | 7.1 |",
        "| widest width / d | 7.1 | 455 |",
        "| N_causal growth (AtP over all tokens) | x7.34 [5.90, 8.80] | x4.35 |",
        "| N_causal growth (AtP over firing tokens (features with 1+ eval firings)) | x7.34 |  |",
        "| firing features below epsilon (widest SAE) | 92.1% | 97.9% |",
        "| total attribution A / epsilon (Markov ceiling on N_causal), widest | 462 |  |",
        "| kappa_hat [95% CI over the tokens] | 433 [311, 698] | 1,990 [545, 5,130] |",
        "| kappa_hat / d | 0.75 [0.54, 1.21] | 0.86 |",
        "| kappa_SAE, plug-in (widest) [95% CI] | 127 [118, 136] |  |",
        "| direct kappa (erank, gauge-invariant logits reading, corrected) | 258 [242, 275] |  |",
        "| kappa_PR (direct, the same reading, U-statistics) | 94.7 [87, 103] | 280 |",
        "| coverage at the widest SAE | 69.6% | 72.0% |",
        "| width for 95% of kappa_hat | 9,880 features | 2,600,000 features |",
    ):
        assert row in md


def test_sweeps_show_the_calibration_and_every_width():
    results = make_results()
    figures = {"wedge_topk": Path("/f/wedge_topk.png"), "atp_topk": Path("/f/atp_topk.png")}
    md = text(sweeps, results=results, figures=figures)
    assert "## The sweep: topk SAEs" in md
    assert (
        "epsilon = 3.211e-05 (the 98th percentile of AtP at width 1024; 95% interval "
        "[2.9e-05, 3.5e-05]); 8,192 eval tokens in 32 blocks, 200 bootstrap resamples"
    ) in md
    assert (
        "| width | N_repr | N_repr 95% | N_causal | N_causal 95% | inert | L0 | FVE | dead | "
        "CE rec. |"
    ) in md
    assert (
        "| 1,024 | 1,010 | [998, 1,022] | 41 (calibration) | [35, 48] | 95.9% | 31.9 | 0.812 "
        "| 7.0% | 0.913 |" in md
    )
    assert (
        "| 4,096 | 3,816 | [3,790, 3,840] | 301 | [270, 333] | 92.1% | 31.6 | 0.871 | 11.1% | "
        "0.952 |"
    ) in md
    assert "| 2,048 | 1,987 | [1,970, 2,003] | 117 | [101, 130] | 94.1% | 32.1 |" in md
    assert "![wedge_topk](f/wedge_topk.png)" in md and "![atp_topk](f/atp_topk.png)" in md
    assert "![" not in text(sweeps, results=results)  # no figure drawn, none referenced


def test_sweeps_with_a_binding_constraint_give_two_fit_tables():
    md = text(sweeps, results=make_results())
    chosen = "every form side by side; chosen by AICc: hyperbolic."
    assert f"Saturating fits (free), {chosen}" in md
    assert f"Saturating fits (kappa <= d), {chosen}" in md
    assert "binds no fit" not in md
    header = (
        "| form | kappa_hat | 95% CI | AICc | AIC | width for 95% (features) | won in resamples "
        "| note |"
    )
    assert md.count(header) == 2
    free, bounded = md.split("Saturating fits (kappa <= d)")
    assert "| exponential | 318 | [280, 372] | 24.52 | 14.52 | 4,201 | 21.5% |  |" in free
    assert "| hyperbolic | 433 | [311, 698] | 19.87 | 9.87 | 9,880 | 67.0% |  |" in free
    assert (
        "| lomax | 4,321 | [350, 9,999] | 21.03 | 11.03 | 2,500,000 | 11.5% | a at its bound |"
        in free
    )
    assert (
        "| lomax | 576 | [350, 576] | 21.91 | 11.91 | 2,100,000 | 11.5% | kappa at its bound |"
        in bounded
    )
    assert "4,321" not in bounded


def test_sweeps_with_a_constraint_that_binds_no_fit_give_one_table():
    results = make_results(sweep={"topk": architecture(binds=False)})
    md = text(sweeps, results=results)
    assert "Saturating fits (free), every form side by side; chosen by AICc: hyperbolic." in md
    assert "The constraint kappa <= d = 576 binds no fit: the same table holds." in md
    assert "Saturating fits (kappa <= d)" not in md
    assert md.count("| form | kappa_hat |") == 1


def test_a_sweep_whose_counts_do_not_grow_gives_no_kappa_hat_but_the_reason():
    results = make_results()
    a = results["sweep"]["topk"]
    reason = "N_causal does not grow with width (x0.33 over the sweep)"
    a.update(estimable=False, not_estimable=reason, warnings=[])
    md = text(headline, beside_paper, sweeps, results=results)
    assert f"- SAE estimate (topk): kappa_hat not estimable: {reason}." in md
    assert f"kappa_hat is not estimable: {reason}." in md
    assert "| kappa_hat [95% CI over the tokens] | not estimable | 1,990 [545, 5,130] |" in md
    assert "| kappa_hat / d | n/a | 0.86 |" in md
    assert "kappa_hat = 433" not in md and "Constrained to kappa <= d" not in md
    assert "Saturating fits" not in md and "No fit is shown" in md  # no asymptote to read
    assert summary(results).splitlines()[4] == f"kappa_hat: not estimable ({reason})"


def test_sweeps_diagnose_the_estimator_and_the_splits():
    md = text(sweeps, results=make_results())
    assert "The reference width is 1.78 d and the widest 7.1 d (the paper: 7.1 d and 455 d)" in md
    assert (
        "| width | A | A / epsilon | N_causal | N_causal' | firings (train) | firings (eval) | "
        "top 2% rate | kappa_SAE [95%] |"
    ) in md
    assert "| 1,024 | 0.011 | 332 | 41 | 82 | 2,688 | 128 | 25.0% | 101 [95, 108] |" in md
    assert (
        "At the widest SAE kappa_SAE is 127 [118, 136], +5.1% from the second widest. It is a "
        "plug-in erank, biased low at few samples per dimension and not corrected as the "
        "direct kappa is, so the headline does not set it beside the direct kappa."
    ) in md
    assert "How the reference's 41 causal features split" in md
    assert "| 4,096 | 0.88 | 3.0 | 45.0% | 0.97 |" in md
    assert "N_causal per seed" not in md
    results = make_results()
    a = results["sweep"]["topk"]
    a["seeds"] = 3
    for r in a["per_width"]:
        r["n_causal_seeds"] = [r["n_causal"], r["n_causal"] + 1, r["n_causal"] - 2]
    md = text(sweeps, results=results)
    assert "3 trainings per width" in md and "| 41, 42, 39 |" in md


def test_the_slope_says_how_many_widths_it_rests_on():
    results = make_results()
    results["sweep"]["topk"]["wedge"]["n_causal_loglog_widths"] = 2
    md = text(headline, results=results)
    assert "(log-log slope 1.44, from 2 of 3 widths (zero counts left out))" in md


def test_every_architecture_gets_its_own_sweep_section():
    second = architecture()
    second["epsilon"] = 7.5e-06
    md = text(sweeps, results=make_results(sweep={"topk": architecture(), "relu": second}))
    assert md.index("## The sweep: topk SAEs") < md.index("## The sweep: relu SAEs")
    assert "epsilon = 7.5e-06 (the 98th percentile" in md


def without_bootstrap() -> dict:
    """A run with --bootstrap 0 and the rarer missing values: no intervals, no eval
    metrics, no growth ratio, no loss reading, no coverage."""
    results = make_results()
    a = results["sweep"]["topk"]
    a["bootstrap"], a["epsilon_95"] = 0, []
    for r in a["per_width"]:
        del r["n_causal_95"], r["n_repr_95"]
        r["l0"] = r["fraction_variance_explained"] = r["dead_fraction"] = None
        r["ce_loss_recovered"] = None
    for k in a["kappa"].values():
        k["interval_95"] = [math.nan, math.nan]
        k["form_frequency"] = {}
        k["width_95"] = math.nan
        k["coverage"] = math.nan
        for f in k["fits"].values():
            f["interval_95"] = [math.nan, math.nan]
    a["wedge"].update(
        n_repr_growth=None,
        n_causal_growth=None,
        n_causal_loglog_slope=None,
        n_causal_growth_95=None,
    )
    for reading in ("loss", "logits", "logits_uncentred"):  # --logit-probes 0
        del results["sigma"][reading]
    for est in results["sigma"].values():
        if est["erank_corrected"] is not None:
            est["erank_corrected_95"] = est["participation_ratio_unbiased_95"] = None
    return results


def test_missing_values_render_as_na():
    results = without_bootstrap()
    md = text(headline, beside_paper, sweeps, direct_sigma, results=results)
    assert "kappa_hat = 433, 95% bootstrap interval [n/a]" in md
    assert "N_causal(m_max) / kappa_hat = n/a; 95% of kappa_hat is reached at a width of n/a." in md
    assert "Constrained to kappa <= d: kappa_hat = 433 [n/a] (hyperbolic)." in md
    # without logit probes there is no direct kappa: fisher stands beside, by name
    assert "- Direct kappa: not measured (the run had no logit probes)." in md
    assert (
        "- Beside it, the fisher reading, erank(E[J^T (diag p - p p^T) J]), from 8,192 eval "
        "tokens: 232 [n/a], "
        "participation ratio 79.9."
    ) in md
    (wedge,) = lines_with(md, "The wedge over x4")
    assert "N_repr grows" in wedge and "(log-log slope 0.96)" in wedge
    assert wedge.count("n/a") == 4  # two growth ratios, an interval and one slope
    assert "| kappa_hat [95% CI over the tokens] | 433 [n/a] | 1,990 [545, 5,130] |" in md
    assert (
        "| direct kappa (erank, gauge-invariant logits reading, corrected) | n/a (no logit "
        "probes) |  |"
    ) in md
    assert "| kappa_PR (direct, the same reading, U-statistics) | n/a | 280 |" in md
    assert "| coverage at the widest SAE | n/a | 72.0% |" in md
    assert "| width for 95% of kappa_hat | n/a | 2,600,000 features |" in md
    assert "95% interval [n/a]); 8,192 eval tokens in 32 blocks, 0 bootstrap resamples" in md
    assert (
        "| 1,024 | 1,010 | [n/a] | 41 (calibration) | [n/a] | 95.9% | n/a | n/a | n/a | n/a |" in md
    )
    assert "| hyperbolic | 433 | [n/a] | 19.87 | 9.87 | 9,880 | n/a |  |" in md
    assert (
        "| fisher | raw | erank(E[J^T (diag p - p p^T) J]) | 232 [n/a] | 0.403 | 79.9 | [n/a] | "
        "210.9 | 66.6 | 5,184 | 8,192 |" in md
    )
    assert "nan" not in md


def test_direct_sigma_tabulates_every_reading_with_its_warning():
    figures = {"sigma": Path("/f/sigma.png")}
    md = text(direct_sigma, results=make_results(), figures=figures)
    assert "## Direct Sigma" in md
    assert (
        "| reading | metric | erank of | erank (corrected) [95%] | /d | PR (U-stat.) | 95% CI | "
        "erank (plug-in) | PR (plug-in) | independent | tokens | samples | warning |"
    ) in md
    assert (
        "| loss | raw | erank(E[g g^T]), g = dLoss/dh | 136 [121, 145] | 0.236 | 54.7 | [50, 59] | "
        "123.4 | 45.6 | 5,184 | 8,192 | 8,192 |  |"
    ) in md
    assert "| fisher | raw | erank(E[J^T (diag p - p p^T) J]) | 232 [219, 253] |" in md
    assert "| not converged: erank changed |" in md
    assert (
        "| activations | raw | erank(Cov[h]) | n/a | n/a | n/a | [n/a] | 301.2 | 12.3 | n/a | "
        "8,192 | 8,192 |  |"
    ) in md
    assert "activation-weighted" not in md  # an older run: no twins, no words for them
    twin = {**make_results()["sigma"]["logits"], "definition": "erank(C^1/2 S C^1/2)"}
    results = make_results()
    results["sigma"]["logits"]["activation_weighted"] = twin
    weighted = text(direct_sigma, results=results)
    assert "| logits | act | erank(C^1/2 S C^1/2) |" in weighted
    assert "The activation-weighted one, kappa_act" in weighted
    assert "50.0% of the uncentred reading's trace lies along the shift of all logits" in md
    assert md.index("| loss |") < md.index("| logits |") < md.index("| activations |")
    assert "![sigma](f/sigma.png)" in md
    assert text(direct_sigma, results=make_results(sigma={})) == "\n"  # no reading: no section


def test_provenance_names_every_input_and_the_hardware():
    md = text(provenance, results=make_results())
    assert "## Provenance" in md
    for item in (
        "- model smollm2-135m (llama): model.safetensors sha256:aa11, config.json sha256:bb22",
        "- corpus builtin-py3.11, sha256 c0ffee42",
        "- store store/L15-3fa9 (written by this run), manifest sha256 deadbeef99",
        "- ran on cpu: model pass in float32, batches of 8 sequences; SAE encoder product in "
        "float32; SAE jobs in process",
        f"- versions: causaldim {__version__}, torch 2.4.0, python 3.11.7",
        "- seconds: harvest 100.3, sweep 400.0, report 11.4, total 611.8",
        "- CE loss recovered on 8,128 predictions: clean loss 3.211, mean-ablated 7.654",
    ):
        assert item in md


def test_provenance_of_a_hub_model_a_reused_store_ray_and_no_ce():
    results = make_results(ce=None)
    hub = {"name": "gpt2", "family": "gpt2", "hub_id": "openai/gpt2", "revision": "abc123"}
    results["inputs"]["model"] = hub
    del results["inputs"]["corpus"]["sha256"]
    results["store"]["reused"] = True
    results["config"]["sweep"]["executor"] = "ray"
    md = text(provenance, results=results)
    assert "- model gpt2 (gpt2): hub openai/gpt2 revision abc123" in md
    assert "- corpus builtin-py3.11, sha256 n/a" in md
    assert "(reused), manifest sha256" in md
    assert "SAE jobs on Ray" in md
    assert "CE loss recovered" not in md


def test_sigma_table_lists_every_reading_and_its_warning():
    table = sigma_table(make_results()).splitlines()
    assert table[0].split() == [
        *("reading", "metric", "erank", "95%", "interval", "/d", "PR"),
        *("plug-in", "indep./d", "converged", "tokens"),
    ]
    assert table[1].split() == [
        *("loss", "raw", "136", "[", "121.2,", "145.0]", "0.236", "54.7"),
        *("123.4", "9.0", "yes", "8,192"),
    ]
    assert table[3].startswith("logits_uncentred ")
    assert table[4].startswith("fisher ")
    assert table[5] == "  warning: not converged: erank changed"
    assert table[6].split()[:5] == ["activations", "raw", "n/a", "n/a", "n/a"]
    assert table[7].startswith("direct kappa: the logits reading, erank(E[J^T (I - 11^T/V) J])")
    assert len(table) == 8


def test_a_headline_that_has_not_converged_says_so_everywhere():
    """The CLI table, the headline, beside-the-paper and the Direct Sigma table."""
    results = make_results()
    results["sigma"]["logits"] = sigma_estimate(
        "logits", 234.5, 78.9, [220.1, 249.9], converged=False
    )
    flag = "(not converged; about 32,768 eval tokens would do)"
    md = text(headline, beside_paper, direct_sigma, results=results)
    assert md.count(flag) >= 3
    assert "NOT converged" in md
    table = sigma_table(results)
    logits = [line.split() for line in table.splitlines() if line.startswith("logits ")]
    assert [row[-2] for row in logits] == ["NO"]


def test_sigma_table_writes_a_missing_interval_as_na():
    table = sigma_table(without_bootstrap())
    assert "nan" not in table and "n/a" in table


def test_summary_is_the_few_lines_printed_at_the_end():
    lines = summary(make_results()).splitlines()
    assert lines[0] == (
        "kappa of layer 15 (d = 576), raw (the paper's definition): 258 [242, 275] = 0.45 d, "
        "converged (9.0 independent equivalents per dimension); activation-weighted: not "
        "measured."
    )
    assert lines[1].startswith("Claims about kappa, decided by the direct estimate: ")
    assert lines[2].startswith("Claims about the SAE estimator, set against the direct kappa: ")
    assert lines[3:] == [
        "topk sweep 1024..4096: N_repr x3.78, N_causal x7.34 over x4 in width (AtP over all "
        "tokens; over firing tokens: x7.34); epsilon 3.21e-05",
        "kappa_hat 433 [311, 698] (hyperbolic, by AICc), kappa_hat/d 0.75, coverage 69.6%; "
        "constrained to d: 433 [311, 576]",
        *conditions_lines(make_results()),
        "read with care (3):",
        *[f"  Topk: {w} (sae.topk.{c})" for c, w in zip(CODES, WARNINGS, strict=True)],
    ]
    results = make_results()
    results["sweep"]["topk"]["cautions"] = []
    # kappa, two claims lines, sweep, kappa_hat, conditions
    assert len(summary(with_warnings(results)).splitlines()) == 7
    lines = summary(without_bootstrap()).splitlines()
    assert lines[0] == "kappa of layer 15: not measured (the run had no logit probes)."
    assert "[n/a]" in lines[4] and "coverage n/a" in lines[4]


def test_build_report_puts_the_sections_in_order():
    results = make_results()
    results["controls"] = {"scale": {"architecture": "topk", "skipped": "no second model"}}
    md = build_report(results, {}).markdown(Path("/"))
    order = [
        "# Causal dimensionality",
        "## Headline",
        "## Beside the paper",
        "## The sweep: topk SAEs",
        "## Direct Sigma",
        "## Controls",
        "### Scale (topk)",
        "Not run: no second model.",
        "## Provenance",
    ]
    at = [md.index(s) for s in order]
    assert at == sorted(at)
    assert "## Controls" not in build_report(make_results(), {}).markdown(Path("/"))


# ----------------------------------------------------------------------------- render, load


def test_figure_plan_has_the_run_and_the_controls_figures(tmp_path):
    results = make_results()
    results["controls"] = {
        "thresholds": {"architecture": "topk", "rows": []},  # planned, not drawn
        "l0": {"target": 32.0, "tolerance": 0.1, "rows": [], "n_flagged": 0},  # no figure
        "scale": {"architecture": "topk", "skipped": "no second model"},
    }
    plan = figure_plan(results, tmp_path)
    assert list(plan) == ["sigma", "wedge_topk", "atp_topk", "control_thresholds"]
    assert plan["wedge_topk"][0] == tmp_path / "figures" / "wedge_topk.png"
    assert list(figure_plan(make_results(sigma={}, controls={}), tmp_path)) == [
        "wedge_topk",
        "atp_topk",
    ]


def test_render_writes_the_reports_and_figures_from_results_json(tmp_path):
    results = make_results()
    results["controls"] = {
        "l0": {
            "target": 32.0,
            "tolerance": 0.1,
            "rows": [
                {
                    "architecture": "topk",
                    "width": 1024,
                    "l0": 31.87,
                    "relative_error": -0.0041,
                    "flagged": False,
                }
            ],
            "n_flagged": 0,
        },
        "scale": {"architecture": "topk", "skipped": "needs a second model"},
    }
    path = tmp_path / "run" / "results.json"
    write_sealed_json(path, results)
    folder = path.parent
    written = render(path)
    figures = [folder / "figures" / f"{k}.png" for k in ("sigma", "wedge_topk", "atp_topk")]
    tables = [folder / "tables" / f"{k}.csv" for k in ("sigma", "widths", "fits", "saes", "claims")]
    assert written == [*figures, folder / "report.md", folder / "report.html", *tables]
    for f in figures:
        assert f.read_bytes().startswith(PNG) and f.stat().st_size > 1000
    md = (folder / "report.md").read_text()
    assert md.startswith("# Causal dimensionality of smollm2-135m, layer 15\n")
    assert "![wedge_topk](figures/wedge_topk.png)" in md and "![sigma](figures/sigma.png)" in md
    assert "kappa_hat = 433, 95% bootstrap interval [311, 698]" in md
    assert "### Matched L0\n\n| architecture | width | L0 (eval) | off target | flag |" in md
    assert "| topk | 1024 | 31.87 | -0.4% |  |" in md
    assert "### Scale (topk)\n\nNot run: needs a second model." in md
    page = (folder / "report.html").read_text()
    assert "<title>causaldim: smollm2-135m</title>" in page
    assert page.count("data:image/png;base64,") == 3
    assert "(kappa &lt;= d)" in page and "(kappa <= d)" not in page
    assert "<td class='n'>1,010</td>" in page

    # Text alone re-renders from the figures on disk; figures alone leave the text be.
    (folder / "report.md").unlink()
    assert render(path, figures=False) == [folder / "report.md", folder / "report.html", *tables]
    assert (folder / "report.md").read_text() == md
    assert render(path, text=False) == figures


def test_the_run_figures_draw_without_bootstrap_intervals(tmp_path):
    """--bootstrap 0: NaN kappa intervals, no count or erank intervals, no loss reading."""
    results = without_bootstrap()
    for name, draw in (
        ("sigma", lambda p: plot_sigma(results, p)),
        ("wedge", lambda p: plot_wedge(results, "topk", p)),
        ("atp", lambda p: plot_atp(results, "topk", p)),
    ):
        path = tmp_path / f"{name}.png"
        assert draw(path) == path
        assert path.read_bytes().startswith(PNG) and path.stat().st_size > 1000


def test_load_results_reads_back_what_was_written(tmp_path):
    results = make_results()
    path = tmp_path / "results.json"
    write_sealed_json(path, results)
    loaded = load_results(path)
    assert loaded["schema"] == SCHEMA
    assert loaded["sweep"]["topk"]["kappa"]["free"]["kappa"] == 432.7


@pytest.mark.parametrize(
    ("schema", "named"),
    [("causaldim.results/1", "causaldim.results/1"), (None, "none (an older causaldim)")],
)
def test_load_results_refuses_another_schema(tmp_path, schema, named):
    results = make_results()
    if schema is None:
        del results["schema"]
    else:
        results["schema"] = schema
    path = tmp_path / "results.json"
    write_sealed_json(path, results)
    with pytest.raises(UsageError) as info:
        load_results(path)
    message = str(info.value)
    assert f"has schema {named}, this causaldim reads {SCHEMA}" in message
    assert "re-run `causaldim run` with the same --out" in message
    assert "\n" not in message


def test_load_results_refuses_a_missing_or_altered_file(tmp_path):
    path = tmp_path / "results.json"
    with pytest.raises(UsageError, match="does not exist"):
        load_results(path)
    write_sealed_json(path, make_results())
    altered = json.loads(path.read_text())
    altered["seed"] = 8
    path.write_text(json.dumps(altered))
    with pytest.raises(IntegrityError, match="altered"):
        load_results(path)
    path.write_text('{"schema": "causaldim.results/5", "seed"')  # truncated
    with pytest.raises(IntegrityError, match="damaged"):
        load_results(path)


@pytest.mark.parametrize("content", ['{"model": "x", "layers": [1, 2]}', "[1, 2, 3]", "a = 1"])
def test_load_results_says_a_json_that_is_not_causaldims_is_not_a_results_file(tmp_path, content):
    path = tmp_path / "other.json"
    path.write_text(content)
    with pytest.raises(UsageError) as info:
        load_results(path)
    message = str(info.value)
    assert "is not a causaldim results file" in message and "schema" in message
    assert "re-run" not in message and "\n" not in message


def test_an_unconverged_headline_is_flagged_by_the_api_and_in_the_warnings(tmp_path):
    import causaldim

    results = make_results()
    results["sigma"]["logits"] = sigma_estimate(
        "logits", 234.5, 78.9, [220.1, 249.9], converged=False
    )
    results["sigma"]["logits"]["cautions"] = [["not_converged", "not converged: more tokens"]]
    del results["direct_kappa"]
    with_warnings(results)
    assert results["headline"]["converged"] is False
    assert "direct.logits.not_converged" in results["headline"]["warnings"]
    (w,) = [w for w in results["warnings"] if w["code"] == "direct.logits.not_converged"]
    assert w["severity"] == "caution"
    write_sealed_json(tmp_path / "results.json", results)
    res = causaldim.load(tmp_path)
    assert "(not converged; about 32,768 eval tokens would do)" in repr(res)
    assert "not converged" in repr(res.kappa) and res.warnings == results["warnings"]
    assert "(direct.logits.not_converged)" in summary(results).split("read with care")[1]


def test_the_fits_table_holds_every_fit_the_report_shows_estimable_or_not():
    from causaldim.report.tables import fit_rows

    results = make_results()
    rows = fit_rows(results)
    assert rows and all(r["estimable"] for r in rows)
    results["sweep"]["topk"]["estimable"] = False  # the report still shows its fits
    again = fit_rows(results)
    assert [r["kappa_hat"] for r in again] == [r["kappa_hat"] for r in rows]
    assert not any(r["estimable"] for r in again)


def test_a_corrected_erank_below_the_floor_is_not_given_as_a_value():
    from causaldim.report.direct import flagged

    est = sigma_estimate("logits", 223.0, 90.0, [400.0, 460.0], converged=False)
    est["n_independent"] = 0.2 * D  # 0.2 independent equivalents per dimension
    shown = flagged(est)
    assert shown.startswith("n/a (not converged: 0.2 independent equivalents per dimension")
    assert shown.count("not converged") == 1 and shown.endswith("eval tokens would do)")
    assert "245" not in shown and "[440, 506]" not in shown  # no corrected value, no interval
    results = make_results()
    results["sigma"]["logits"] = est
    (row,) = [r for r in sigma_table(results).splitlines() if r.startswith("logits ")]
    assert row.split()[1:4] == ["raw", "n/a", "n/a"]
    (line,) = lines_with(text(direct_sigma, results=results, figures={}), "| logits |")
    assert line.count("n/a") >= 2 and f"{1.1 * 223.0 / D:.3f}" not in line  # no /d either
    assert f"{1.1 * 223.0 / D:.2f} d" not in text(headline, results=results)


def test_an_interval_that_misses_its_point_is_said_to_be_biased():
    from causaldim.fmt import ci_of

    assert ci_of(250, [232.0, 247.0]) == "[no interval: the resamples lie all below the point]"
    assert ci_of(3.60, [3.70, 4.47], 2) == "[no interval: the resamples lie all above the point]"
    assert ci_of(240, [232.0, 247.0]) == "[232, 247]" and ci_of(5, None) == "[n/a]"
    results = make_results()
    results["sweep"]["topk"]["per_width"][0]["n_repr_95"] = [990.0, 1005.0]  # N_repr 1,010
    md = text(sweeps, results=results, figures={})
    assert "| 1,010 | [no interval: the resamples lie all below the point] |" in md
    assert "[990, 1,005]" not in md


def test_the_html_report_holds_no_literal_markdown():
    results = make_results()
    page = build_report(results, {}).html("causaldim")
    assert "<strong>" in page and "<code>" in page
    assert "**" not in page and "`" not in page
    assert "<td class='n'>" in page  # figures set right, prose left


def test_a_bar_inside_a_table_cell_does_not_end_it():
    doc = Doc()
    doc.table(["claim", "verdict"], [["kappa <= min(d, |V|)", "holds"]])
    (row,) = [r for r in doc.markdown(Path("/")).splitlines() if r.startswith("| kappa")]
    assert row == "| kappa <= min(d, \\|V\\|) | holds |"


def test_outliers_that_are_all_position_0_are_said_to_be():
    from causaldim.report.cautions import outlier_count

    gemma = {"n_outliers": 640, "n_tokens": 81_920}  # 640 sequences of 128
    assert outlier_count(gemma, 128) == "640 tokens, each position 0 of its sequence"
    assert outlier_count({"n_outliers": 700, "n_tokens": 81_920}, 128) == (
        "700 tokens (640 at position 0 of their sequence, 60 by norm)"
    )
    assert outlier_count({"n_outliers": 7}, 128) == "7 tokens"
