"""results.json: its schema, how a run's stages are assembled into it, and reading it back
(the single source of every number and figure in the report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from .. import __version__, versions
from ..claims.conditions import conditions
from ..claims.flags import current
from ..errors import UsageError
from ..fileio import read_sealed_json, sha256_file
from ..measures.debias import MIN_INDEPENDENT_PER_DIM
from ..measures.sigma import HEADLINE
from ..paper import PAPER
from .cautions import collect, headline_object, touching_headline

if TYPE_CHECKING:
    from ..config import AnalysisConfig, HarvestConfig
    from ..harvest import Store
    from ..measures.layer import Measurement
    from ..sweep_config import SweepConfig
    from ..threads import Threads

SCHEMA = "causaldim.results/5"


def load_results(path: Path | str) -> dict:
    """A results.json of this schema, or a one-line UsageError naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist; pass the results.json of a run")
    try:
        plain = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        # a run's results.json cut short is damaged (read_sealed_json says so); any
        # other file that is not JSON is not a results file at all
        plain = None if path.name == "results.json" else []
    ours = isinstance(plain, dict) and (
        str(plain.get("schema", "")).startswith("causaldim.results/")
        or "causaldim_version" in plain  # an older causaldim's, from before the schema
    )
    if plain is not None and not ours:
        raise UsageError(
            f'{path} is not a causaldim results file (expected a JSON object with "schema": '
            f'"{SCHEMA}", as `causaldim run` writes OUT/results.json); pass a run\'s '
            "results.json"
        )
    results = read_sealed_json(path, "results (causaldim run with the same --out)")
    schema = results.get("schema")
    if schema != SCHEMA:
        raise UsageError(
            f"{path} has schema {schema or 'none (an older causaldim)'}, this causaldim "
            f"reads {SCHEMA}: re-run `causaldim run` with the same --out to rebuild it"
        )
    results = current(results)  # every flag under today's rule, whenever the run was
    if any(w["code"] == "run.flags_recomputed" for w in results.get("warnings") or []):
        # the warnings the flags raise, raised again under the current rule
        derived = ("direct.", "profile.")
        kept = [w for w in results["warnings"] if not w["code"].startswith(derived)]
        results["warnings"] = kept + [w for w in collect(results) if w["code"].startswith(derived)]
    return results


def direct_kappa(sigma: dict) -> dict | None:
    """The headline's direct number: the gauge-invariant logits reading's corrected erank,
    what it is of, its interval and whether it converged (None without logit probes)."""
    est = sigma.get(HEADLINE)
    if est is None:
        return None
    return {
        "reading": HEADLINE,
        "definition": est["definition"],
        "value": est["erank_corrected"],
        "interval_95": est["erank_corrected_95"],
        "converged": est["converged"],
        "eval_tokens_needed": est["eval_tokens_needed"],
        "n_independent": est["n_independent"],
        "estimator": "spectrum deconvolved with sequences as units (measures/debias.py)",
        "activation_weighted": _twin(est.get("activation_weighted")),
    }


def _twin(est: dict | None) -> dict | None:
    """The headline reading in the activations' metric (measures/kappa.py), in brief."""
    if est is None:
        return None
    keys = ("definition", "converged", "eval_tokens_needed", "n_independent")
    return {
        "value": est["erank_corrected"],
        "interval_95": est["erank_corrected_95"],
        **{k: est[k] for k in keys},
    }


def _extension(store: Store) -> dict:
    m = store.manifest
    ev = m["splits"]["eval"]
    return {
        "path": str(store.root.parent.name + "/" + store.root.name),
        "tokens": ev["n_tokens"],
        "n_outliers": ev["n_outliers"],
        "throughput_tokens_per_second": ev.get("tokens_per_second"),
        "pass": m.get("pass", "full"),
        "probes_drawn": m["probes"].get("drawn", "over the vocabulary"),
    }


def build_results(
    *,
    preset: str,
    harvest_cfg: HarvestConfig,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig,
    store: Store,
    store_reused: bool,
    out: Path,
    here: Measurement,
    controls: dict,
    subspace: dict,
    headline: str,
    profile: dict | None = None,
    started: str,
    seconds: dict,
    threads: Threads | None = None,
    notes: tuple = (),
    rounds=None,
    extension: Store | None = None,
    weights: dict | None = None,
    ladder: dict | None = None,
) -> dict:
    """results.json of a run, from its resolved configs, the headline layer's store and
    Measurement, the controls' results and the notes its plan printed ([code, message])."""
    from ..model.corpus import describe_corpus
    from ..model.load import describe_model

    m = store.manifest
    training = {
        e.name: {
            "folder": str(e.folder.relative_to(out)),
            "reused": e.reused,
            "seconds": e.meta["train_stats"]["seconds"],
            "steps": e.meta["train_stats"].get("steps"),
            # --drop-weights: deleted once scored (its scores and digest are kept)
            **({"weights_dropped": True} if e.dropped else {}),
            # imported: path, format, the site its metadata names ("unknown" if none) and,
            # by --sae-release, release, id, repo and revision
            **({"source": e.meta["source"]} if e.meta.get("source") else {}),
        }
        for e in [*here.entries, *here.replicates]
    }
    sweep = sweep_cfg.to_dict()
    if sweep.get("sae_release"):  # the files fetched are under saes, not --sae-paths
        sweep["sae_paths"] = []
    results = {
        "schema": SCHEMA,
        "causaldim_version": __version__,
        "preset": preset,
        "config": {
            "harvest": harvest_cfg.to_dict(),
            "sweep": sweep,
            "analysis": analysis_cfg.to_dict(),
        },
        "seed": harvest_cfg.seed,
        "inputs": {
            "model": {
                **m["model"]["identity"],
                "description": describe_model(m["model"]["identity"]["name"]),
            },
            "corpus": {**m["corpus"], "description": describe_corpus(m["corpus"])},
            "store": {
                "path": str(store.root.relative_to(out)),
                "manifest_sha256": sha256_file(store.root / "manifest.json"),
                "key": m["key"],
            },
        },
        "store": {
            "reused": store_reused,
            "model": m["model"],
            "layer": m["layer"],
            "site": m["site"],
            "seq_len": m["seq_len"],
            "tokens": {k: v["n_tokens"] for k, v in m["splits"].items()},
            "throughput_tokens_per_second": {
                k: v["tokens_per_second"] for k, v in m["splits"].items()
            },
            "outliers": m["outliers"],
            "eval_mean_loss": m["splits"]["eval"]["mean_loss"],
            "probes": {"logits": m["key"]["logit_probes"], "fisher": m["key"]["fisher_probes"]},
            "probes_drawn": m["probes"].get("drawn", "over the vocabulary"),
            # --headline-tokens: eval sequences beyond the run's that the headline reading
            # (and the activations') also reads, harvested by the pass that skips the head
            "headline_extension": None if extension is None else _extension(extension),
        },
        "sigma": here.sigma_dicts(),
        # what "converged" took (runs before this key: 4)
        "min_independent_per_dim": MIN_INDEPENDENT_PER_DIM,
        "direct_kappa": direct_kappa(here.sigma_dicts()),
        # each direct reading with the other choice of outliers, from the same eval tokens
        "sigma_other_outliers": here.other_outliers,
        # --until-converged: each round's eval tokens and headline, and why it stopped
        "until_converged": None if rounds is None else rounds.to_dict(),
        "ce": None if here.ce is None else {k: v for k, v in here.ce.items() if k != "saes"},
        "saes": training,
        "sweep": here.analysis,
        "controls": controls,
        "subspace": subspace,
        "profile": profile,  # every layer's Sigma (--profile), or None
        # what the weights alone predict of kappa at every layer (measures/weights.py)
        "weights": weights,
        # which directions matter, by intervention (measures/ladder.py), or None
        "ladder": ladder,
        "headline": {},  # below: it lists the warnings that touch it
        "paper": PAPER,
        "versions": {**m["versions"], **versions("python", "numpy", "scipy")},
        "started": started,
        "seconds": seconds,
        # what the run computed with: --threads or one per usable core (the numbers do not
        # depend on it beyond float rounding)
        "threads": None if threads is None else threads.to_dict(),
    }
    # the conditions every verdict holds for, with the paper's beside them
    results["conditions"] = conditions(results)
    results["headline"] = headline_object(results, headline)
    results["warnings"] = collect(results, notes)
    results["headline"]["warnings"] = touching_headline(results["warnings"], headline)
    return results
