"""Every warning a run raises, in one list: results.json's top-level `warnings`, printed
by the CLI after its table, opening the report ("Read with care"), `Results.warnings` and
each side of `causaldim compare`.

Each has a stable code (`direct.logits.not_converged`, `sae.topk.kappa_hat_extrapolated`,
`run.corpus_short`, ...), a severity ("caution" where it touches the headline's numbers,
else "note") and one sentence. The headline object lists the codes that touch it.
"""

from __future__ import annotations

from ..measures.sigma import HEADLINE

CAUTION, NOTE = "caution", "note"


def _item(code: str, message: str, severity: str) -> dict:
    return {"code": code, "severity": severity, "message": message}


def collect(results: dict, notes: list | tuple = ()) -> list[dict]:
    """The run's warnings from the parts of results.json that raise them, and the notes
    its plan printed before it started ([code, message] pairs)."""
    out = [_item(f"run.{code}", message, NOTE) for code, message in notes]
    for reading, est in results.get("sigma", {}).items():
        for code, message in est.get("cautions") or []:
            severity = CAUTION if reading == HEADLINE else NOTE
            out.append(_item(f"direct.{reading}.{code}", f"{reading}: {message}", severity))
        twin = est.get("activation_weighted") or {}
        for code, message in twin.get("cautions") or []:  # notes: the headline is raw
            where = f"{reading} (activation-weighted)"
            out.append(_item(f"direct.{reading}.act.{code}", f"{where}: {message}", NOTE))
    out += _left_out(results)
    arch = results["headline"]["architecture"]
    for name, a in results.get("sweep", {}).items():
        severity = CAUTION if name == arch else NOTE
        poor = _poor_reconstruction(a)
        if poor:
            out.append(_item(f"sae.{name}.poor_reconstruction", f"{name}: {poor}", severity))
        if not a["estimable"]:
            out.append(
                _item(
                    f"sae.{name}.not_estimable",
                    f"{name}: kappa_hat is not estimable: {a['not_estimable']}",
                    severity,
                )
            )
        for code, message in a.get("cautions") or []:
            out.append(_item(f"sae.{name}.{code}", f"{name}: {message}", severity))
    prof = results.get("profile")
    if prof:
        from .direct import converged_at, profile_cautions

        at = converged_at(results)
        for line in profile_cautions(prof, results["config"]["analysis"], at):
            reading = line.split(":", 1)[0]
            kind = "not_converged" if "not converged" in line else "half_drift"
            out.append(_item(f"profile.{reading}.{kind}", f"profile, {line}", NOTE))
    for name, c in (results.get("controls") or {}).items():
        for message in c.get("warnings") or []:
            out.append(_item(f"control.{name}", f"control {name}: {message}", NOTE))
    return out


MOST_VARIANCE = 0.5  # outliers holding this share of the residual variance or more: a caution
POOR = 0.5  # an SAE below this FVE or CE loss recovered reconstructs poorly
LEFT_OUT = "direct.outliers_left_out"


def outlier_count(o: dict, seq_len: int) -> str:
    """The tokens left out, and how many are position 0 of their sequence: a rule set in
    advance (Gemma's 640 "outliers" are its 640 sequences' first tokens), not a selection
    by the data."""
    n = o["n_outliers"]
    first = o["n_tokens"] // seq_len if o.get("n_tokens") and seq_len else None
    if first is None or first > n:
        return f"{n:,} tokens"
    if first == n:
        return f"{n:,} tokens, each position 0 of its sequence"
    return f"{n:,} tokens ({first:,} at position 0 of their sequence, {n - first:,} by norm)"


def _left_out(results: dict) -> list[dict]:
    """Outlier tokens left out of Sigma and the SAEs that hold most of the residual
    variance: what the headline integrates is not the whole stream."""
    store = results.get("store") or {}
    o = store.get("outliers") or {}
    analysis = (results.get("config") or {}).get("analysis") or {}
    if analysis.get("include_outliers") or (o.get("variance_share") or 0) < MOST_VARIANCE:
        return []
    share = o["n_outliers"] / o["n_tokens"] if o.get("n_tokens") else None
    of_them = "" if share is None else f" ({100 * share:.1f}% of them)"
    return [
        _item(
            LEFT_OUT,
            f"position 0 and tokens with a residual norm above {o['factor']:g}x the median, "
            f"{outlier_count(o, store.get('seq_len') or 0)}{of_them}, were left out of Sigma "
            f"and the SAEs; they carry {100 * o['variance_share']:.1f}% of the residual "
            "variance (--include-outliers keeps them)",
            CAUTION,
        )
    ]


def _poor_reconstruction(a: dict) -> str | None:
    """The widths whose SAEs reconstruct poorly (FVE or CE loss recovered below POOR)."""
    poor = [
        r
        for r in a.get("per_width", [])
        if any(
            r.get(key) is not None and r[key] < POOR
            for key in ("fraction_variance_explained", "ce_loss_recovered")
        )
    ]
    if not poor:
        return None

    def span(key: str) -> str:
        vals = [r[key] for r in poor if r.get(key) is not None]
        return "n/a" if not vals else f"{min(vals):.2f}-{max(vals):.2f}"

    widths = ", ".join(f"{r['width']:,}" for r in poor)
    return (
        f"the SAEs of width {widths} reconstruct poorly "
        f"(FVE {span('fraction_variance_explained')}, CE loss recovered "
        f"{span('ce_loss_recovered')}; below {POOR}): their counts describe a poor "
        "dictionary, not the layer"
    )


def touching_headline(warnings: list[dict], architecture: str) -> list[str]:
    """The codes of the warnings that touch the headline: its direct reading's, what was
    left out of Sigma, and the headline architecture's kappa_hat."""
    prefixes = (f"direct.{HEADLINE}.", LEFT_OUT, f"sae.{architecture}.")
    return [w["code"] for w in warnings if w["code"].startswith(prefixes)]


def headline_object(results: dict, architecture: str) -> dict:
    """results.json's `headline`: the direct kappa (reading, value, interval, estimator,
    converged) and the architecture of the SAE estimate beside it."""
    direct = results.get("direct_kappa") or {}
    return {
        "architecture": architecture,
        "reading": direct.get("reading"),
        "value": direct.get("value"),
        "interval_95": direct.get("interval_95"),
        "estimator": direct.get("estimator"),
        "converged": direct.get("converged"),
        "eval_tokens_needed": direct.get("eval_tokens_needed"),
        "warnings": [],
    }


def lines(warnings: list[dict]) -> list[str]:
    """One line each, cautions first: "[caution] direct.logits.not_converged: ..."."""
    ordered = sorted(warnings, key=lambda w: w["severity"] != CAUTION)
    return [f"[{w['severity']}] {w['code']}: {w['message']}" for w in ordered]
