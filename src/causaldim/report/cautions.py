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
    arch = results["headline"]["architecture"]
    for name, a in results.get("sweep", {}).items():
        severity = CAUTION if name == arch else NOTE
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
        from .direct import profile_cautions

        for line in profile_cautions(prof, results["config"]["analysis"]):
            reading = line.split(":", 1)[0]
            kind = "not_converged" if "not converged" in line else "half_drift"
            out.append(_item(f"profile.{reading}.{kind}", f"profile, {line}", NOTE))
    for name, c in (results.get("controls") or {}).items():
        for message in c.get("warnings") or []:
            out.append(_item(f"control.{name}", f"control {name}: {message}", NOTE))
    return out


def touching_headline(warnings: list[dict], architecture: str) -> list[str]:
    """The codes of the warnings that touch the headline: its direct reading's, and the
    headline architecture's kappa_hat."""
    prefixes = (f"direct.{HEADLINE}.", f"sae.{architecture}.")
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
