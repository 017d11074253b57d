"""Flags under the current rule: a run whose flags were decided under an older rule (4
independent equivalents per dimension) is read, claimed and reported under today's (8)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from results_factory import D, make_results

from causaldim.claims import UNTESTABLE, claims
from causaldim.claims.flags import current, current_cell, stale
from causaldim.fileio import read_sealed_json, write_sealed_json
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


def test_every_document_under_docs_stores_the_current_rules_flags():
    """Every run, atlas cell and atlas.csv row under docs/ was measured under the rule of
    8: no stored flag disagrees with it (a run kept from an older rule fails here until
    it is re-run; reading it would recompute its flags, as above)."""
    runs = sorted(DOCS.glob("*/results.json"))
    assert len(runs) >= 3
    for run in runs:
        assert stale(json.loads(run.read_text())) == [], run
    for path in sorted(DOCS.glob("*/atlas.json")):
        for cell in read_sealed_json(path, "atlas")["cells"]:
            assert current_cell(cell) == cell, (path, cell["cell"])
    for path in sorted(DOCS.glob("**/atlas.csv")):
        for row in csv.DictReader(path.open()):
            if row["independent_per_dim"]:
                per_dim = float(row["independent_per_dim"])
                converged = row["converged"] == "True"
                assert (per_dim >= MIN_INDEPENDENT_PER_DIM) == converged, (path, row)
