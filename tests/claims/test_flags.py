"""Flags under the current rule: a run whose flags were decided under an older rule (4
independent equivalents per dimension) is read, claimed and reported under today's (8)."""

from __future__ import annotations

import json
from pathlib import Path

from results_factory import D, make_results

from causaldim.claims import UNTESTABLE, claims
from causaldim.claims.flags import current, stale
from causaldim.fileio import write_sealed_json
from causaldim.measures.debias import MIN_INDEPENDENT_PER_DIM
from causaldim.report.results import load_results

DOCS = Path(__file__).resolve().parents[2] / "docs"


def older_rule_run() -> dict:
    """A run that called its headline converged at 6 per dimension (the rule of 4)."""
    results = make_results()
    results["sigma"]["logits"].update(converged=True, n_independent=6.0 * D)
    results["min_independent_per_dim"] = 4.0
    return results


def test_a_flag_from_an_older_rule_is_recomputed_and_said():
    results = older_rule_run()
    assert stale(results) == ["sigma, logits: stored True, 6.00 per dimension"]
    now = current(results)
    est = now["sigma"]["logits"]
    assert est["converged"] is False and "older rule" in est["warning"]
    assert est["eval_tokens_needed"] > est["n_tokens"]
    assert now["min_independent_per_dim"] == MIN_INDEPENDENT_PER_DIM
    assert any(w["code"] == "run.flags_recomputed" for w in now["warnings"])
    assert results["sigma"]["logits"]["converged"] is True  # the stored copy is left alone
    assert stale(now) == []


def test_no_verdict_rests_on_a_stale_flag():
    (level,) = [c for c in claims(older_rule_run()) if c.key == "kappa_level"]
    assert level.verdict == UNTESTABLE and "not converged" in level.reason


def test_loading_a_results_file_gives_the_current_flags(tmp_path):
    write_sealed_json(tmp_path / "results.json", older_rule_run())
    assert load_results(tmp_path / "results.json")["sigma"]["logits"]["converged"] is False


def test_the_docs_replicate_run_is_read_under_the_current_rule():
    """docs/replicate predates the rule of 8: its stored flags disagree (the literal
    reading at 7.99 per dimension), and docs/claims.md reads the recomputed ones."""
    stored = json.loads((DOCS / "replicate/results.json").read_text())
    assert any("logits_uncentred: stored True, 7.99" in s for s in stale(stored))
    loaded = load_results(DOCS / "replicate/results.json")
    assert stale(loaded) == []
    codes = {w["code"]: w["message"] for w in loaded["warnings"]}
    assert "direct.logits_uncentred.not_converged" in codes  # raised again, under 8
    assert "fewer than 8" in codes["profile.logits_uncentred.not_converged"]
    assert "the logits_uncentred reading has not converged" in (DOCS / "claims.md").read_text()
