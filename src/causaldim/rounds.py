"""Eval sequences beyond the run's own, for the headline alone: the --headline-tokens
extension, then the rounds of `--until-converged` until the headline direct kappa
converges (and, with --target-width, its interval is that narrow), or a cap is reached.

Each harvests the next sequences of the corpus beyond --tokens (in the split's seeded
order) into a store of its own, eval split only, by the headline pass (h and the centred
logit probes' products: no head, no loss gradient, no shift or Fisher probe), its probes
drawn as they would be at that place of one long eval split; the headline reading then
reads the run's eval split and every extension as one. One already harvested (same key)
is reused, so an interrupted run resumes where it stopped. Only the headline reading (and
the activations') read them: the loss, literal and Fisher readings, the SAE sweep, AtP
and CE loss recovered keep the run's own eval split.
"""

from __future__ import annotations

import math
import sys
import time
from typing import NamedTuple

from .config import AnalysisConfig
from .harvest import Plan, Store, harvest
from .harvest.plan import extension_sequences
from .harvest.store import MANIFEST, key_digest
from .harvest.write import EvalObserver, HarvestResult
from .measures.kappa import measure
from .measures.sigma import HEADLINE, SigmaEstimate
from .model.corpus import Splits

MARGIN = 1.15  # a round asks this much over the tokens the last estimate said would do


class Round(NamedTuple):
    eval_tokens: int  # all rounds so far, the run's eval split included
    independent_per_dim: float
    kappa: float | None
    interval: list[float] | None
    converged: bool
    seconds: float

    def to_dict(self) -> dict:
        return self._asdict()


class Rounds(NamedTuple):
    stores: list[Store]  # the run's store, then each round's
    rounds: list[Round]
    stopped: str  # why: "converged", "target width", "cap", "corpus exhausted"

    def to_dict(self) -> dict:
        return {"rounds": [r.to_dict() for r in self.rounds], "stopped": self.stopped}


def _done(est: SigmaEstimate, target: float | None) -> bool:
    if not est.converged:
        return False
    if target is None:
        return True
    assert est.erank_corrected is not None  # converged: it was corrected
    lo, hi = est.erank_corrected_95 or (0.0, math.inf)
    return (hi - lo) / 2 <= target * est.erank_corrected


def _wanted(est: SigmaEstimate, tokens: int, target: float | None) -> int:
    """Eval tokens, all rounds together, that the estimate says would do."""
    want = est.eval_tokens_needed or tokens
    if est.converged and target is not None and est.erank_corrected_95:
        lo, hi = est.erank_corrected_95
        assert est.erank_corrected is not None  # converged: it was corrected
        # the interval narrows as one over the square root of the tokens
        want = tokens * ((hi - lo) / 2 / (target * est.erank_corrected)) ** 2
    return math.ceil(MARGIN * want)


def round_plan(the_plan: Plan, start: int, stop: int, layers: tuple[int, ...] = ()) -> Plan:
    """The plan of the pooled eval sequences [start, stop) beyond the run's, harvested by
    the headline pass at `layers` (default: the headline layer alone)."""
    layer = the_plan.layer
    layers = layers or (layer,)
    none = the_plan.splits.train[:0]  # no train split: eval only
    splits = Splits(none, the_plan.splits.rest(start, stop), 0)
    keys = {
        i: {**the_plan.keys[i], "eval_round": [start, stop], "pass": "headline"} for i in layers
    }
    folder = the_plan.store_dir.parent
    dirs = {i: folder / f"L{i}-headline-{key_digest(keys[i])[:12]}" for i in layers}
    return the_plan._replace(
        splits=splits, key=keys[layer], store_dir=dirs[layer], keys=keys, store_dirs=dirs
    )


def headline_extension(
    the_plan: Plan,
    harvested: HarvestResult,
    load_lm,
    progress: bool,
    observer: EvalObserver | None = None,
) -> dict[int, Store]:
    """The --headline-tokens extension of every harvested layer's eval split (the first
    pooled sequences), by the headline pass; {} where none is asked or the corpus has no
    more. The run's outlier rule, calibrated once, applies to it. The observer (the
    profile's sums) is handed its rows at every layer, as the eval pass's."""
    n = extension_sequences(the_plan)
    if n == 0:
        return {}
    stores = harvested.stores
    assert stores is not None  # harvest() hands back every layer's
    p = round_plan(the_plan, 0, n, tuple(sorted(stores)))
    reused = all((folder / MANIFEST).is_file() for folder in p.store_dirs.values())
    median_norms = {
        **(harvested.median_norms or {}),  # the observer's layers, where the pass ran
        **{i: s.manifest["outliers"]["median_norm"] for i, s in stores.items()},
    }
    result = harvest(
        the_plan.config,
        progress,
        p,
        observer=observer,
        eval_round=len(the_plan.splits.eval),
        lm=None if reused and observer is None else load_lm(),
        median_norms=median_norms,
    )
    assert result.stores is not None  # harvest() hands back every layer's
    return result.stores


def until_converged(
    the_plan: Plan,
    stores: list[Store],
    cfg: AnalysisConfig,
    seed: int,
    device,
    load_lm,
    progress: bool,
) -> Rounds:
    """Rounds until the headline converges, the cap, or the corpus's end; `stores`: the
    run's store and its --headline-tokens extension, if any."""
    hcfg = the_plan.config
    seq_len = hcfg.seq_len
    store = stores[0]
    extended = extension_sequences(the_plan) if len(stores) > 1 else 0
    n_run = len(the_plan.splits.eval)
    pool = the_plan.splits.n_rest
    # the run's outlier rule, calibrated once: every round leaves out what the run does
    median_norms = {the_plan.layer: store.manifest["outliers"]["median_norm"]}
    cap = max(n_run + extended, min(hcfg.max_eval_tokens // seq_len, n_run + pool))
    # done: pooled sequences harvested beyond the run's, the extension's included
    stores, rounds, done = list(stores), [], extended
    batch = hcfg.batch_size or 1
    while True:
        t = time.perf_counter()
        # the stop rule reads the raw headline (the paper's definition) alone
        found = measure(stores, cfg, seed, device, readings=(HEADLINE,), activation_weighted=False)
        est = found[HEADLINE]
        tokens = (n_run + done) * seq_len
        rounds.append(
            Round(
                tokens,
                (est.n_independent or 0.0) / store.d_model,
                est.erank_corrected,
                est.erank_corrected_95,
                bool(est.converged),
                time.perf_counter() - t,
            )
        )
        if _done(est, hcfg.target_width):
            stopped = "converged" if hcfg.target_width is None else "target width"
            break
        if n_run + done >= cap:
            stopped = "cap" if cap < n_run + pool else "corpus exhausted"
            break
        wanted = -(-_wanted(est, tokens, hcfg.target_width) // seq_len)  # sequences, in all
        more = max(batch, wanted - n_run - done)
        more = min(more, cap - n_run - done)
        if progress:
            rate = stores[-1].manifest["splits"]["eval"].get("tokens_per_second")
            eta = (
                f", about {more * seq_len / rate / 60:,.0f} min at {rate:,.0f} tok/s"
                if rate
                else ""
            )
            print(
                f"until converged: {HEADLINE} at {rounds[-1].independent_per_dim:.1f} "
                f"independent equivalents per dimension from {tokens:,} eval tokens; "
                f"harvesting {more * seq_len:,} more (cap {cap * seq_len:,}){eta}",
                file=sys.stderr,
            )
        plan_k = round_plan(the_plan, done, done + more)
        reused = (plan_k.store_dir / "manifest.json").is_file()  # an interrupted run's
        lm = None if reused else load_lm()
        result = harvest(
            hcfg, progress, plan_k, eval_round=n_run + done, lm=lm, median_norms=median_norms
        )
        stores.append(result.store)
        done += more
    return Rounds(stores, rounds, stopped)
