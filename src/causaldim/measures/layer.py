"""Everything measured at one layer from its store: direct Sigma, the SAE sweep (trained
or imported), CE loss recovered where the model is at hand, AtP scores, the decoders'
digests, and each architecture's counts and fits.

The sweep runs whole, or with --drop-weights one width at a time, narrowest first: each
width is trained, spliced, scored and digested, then its weights are deleted (the
reference width's are kept: the wider ones are compared with it). What was kept of a
dropped SAE (cfg.json's `dropped`: its scores' and digest's hashes, CE loss recovered,
and what they were computed with) lets a re-run reuse it, or else train it again."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import torch

from ..config import AnalysisConfig
from ..devices import resolve_device
from ..executors import Executor, LocalExecutor
from ..faults import fault_point
from ..fileio import sha256_file
from ..harvest.store import Store
from ..model.load import LoadedModel
from ..sae import SAE
from ..sweep_config import SweepConfig
from .analysis import analyze
from .diagnose import imported_l0_spread
from .digest import DecoderDigest, digest, digest_path, load_digest, save_digest
from .kappa import measure, other_outlier_choice
from .score import ScoreJob, Scores, load_scores, score_job
from .splice import block_outputs
from .subspace import basis_of
from .sweep import SweepEntry, drop_weights, load_entry, splice_evaluation, sweep_saes


class Measurement(NamedTuple):
    """Everything measured at one layer from its store; per architecture, then width."""

    sigma: dict  # reading -> SigmaEstimate
    entries: list[SweepEntry]  # the sweep's SAEs (replicate 0 of each width)
    digests: dict[str, dict[int, DecoderDigest]]  # what the analysis reads of each decoder
    scores: dict[str, dict[int, Scores]]
    evals: dict[str, dict[int, dict]]
    analysis: dict[str, dict]
    ce: dict | None
    replicates: list[SweepEntry] = []  # the same widths trained again (--sae-seeds)
    # each direct reading with the other choice of outliers (kappa.other_outlier_choice)
    other_outliers: dict | None = None

    def sigma_dicts(self) -> dict:
        """The Sigma estimates as results.json holds them."""
        return {reading: est.to_dict() for reading, est in self.sigma.items()}

    def saes_of(self, architecture: str) -> dict[int, SAE]:
        """That architecture's SAEs by width, loaded from their folders, frozen."""
        return {
            e.width: load_entry(e).requires_grad_(False)
            for e in self.entries
            if e.architecture == architecture
        }


def measure_layer(
    store: Store,
    out: Path,
    sweep_cfg: SweepConfig,
    analysis_cfg: AnalysisConfig,
    seed: int,
    progress: bool,
    seconds: dict,
    load_lm: Callable[[], LoadedModel] | None = None,
    repair: bool = False,
    executor: Executor | None = None,
    imports: list[dict] | None = None,
    eval_stores: list[Store] | None = None,
    both_ways: bool = False,
) -> Measurement:
    """Direct Sigma, the SAE sweep (SAEs under out/saes, trained or imported), AtP scores,
    digests and the analysis of one store, the training and scoring jobs on executor
    (default: in this process, on the CPU); with load_lm, each SAE is also spliced into
    the model (CE recovered). Each stage's seconds go into `seconds`. `imports`: the
    sources of the imported SAEs, as the pipeline's check described them; where their
    eval L0s differ by more than 10%, each sweep's `l0_spread` and warnings say so.
    `eval_stores`: what the direct Sigma reads (the store and its --until-converged rounds;
    default the store); both_ways: also each direct reading with the other choice of
    outliers."""
    executor = executor or LocalExecutor()
    device = resolve_device(executor.device)  # under Ray, the driver's
    read = eval_stores or store

    def timed(name: str, work):  # a stage's seconds, summed over the sweep's groups
        fault_point(f"stage.{name}")
        t = time.perf_counter()
        value = work()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t
        return value

    def direct():  # with the run's choice of outliers, and (the headline layer) the other
        found = measure(read, analysis_cfg, seed, device, progress)
        both = other_outlier_choice(read, analysis_cfg, seed, device) if both_ways else None
        return found, both

    sigma, other = timed("sigma", direct)
    swept = _Swept(
        store,
        Path(out),
        analysis_cfg,
        basis_of(sigma),
        load_lm if sweep_cfg.ce_sequences else None,
        sweep_cfg.ce_sequences,
        reference_width=analysis_cfg.reference_width
        or (None if sweep_cfg.imports else sweep_cfg.widths[0]),
        device=device,
    )
    for group in _groups(sweep_cfg):
        reusable = swept.reusable if sweep_cfg.drop_weights else None
        trained = timed(
            "sweep",
            lambda group=group, reusable=reusable: sweep_saes(
                store, out, group, seed, progress, repair, executor, imports, reusable
            ),
        )
        swept.add(trained, executor, progress, sweep_cfg.drop_weights, timed)
    entries, scores, evals = swept.entries, swept.scores, swept.evals()
    analysis = timed(
        "analysis",
        lambda: {
            arch: analyze(
                scores[arch],
                evals[arch],
                store.d_model,
                analysis_cfg,
                seed,
                swept.digests[arch],
                swept.again.get(arch),
                progress,
            )
            for arch in scores
        },
    )
    if sweep_cfg.imports:  # SAEs of others' L0s: the widths may compare sparsities
        spread = imported_l0_spread(evals)
        for a in analysis.values():
            a["l0_spread"] = spread
            if spread["flagged"]:
                a["warnings"].append(spread["warning"])
                a["cautions"].append(["imported_l0_spread", spread["warning"]])
    return Measurement(
        sigma,
        entries,
        swept.digests,
        scores,
        evals,
        analysis,
        swept.ce,
        swept.replicates,
        other,
    )


def _groups(cfg: SweepConfig) -> list[SweepConfig]:
    """The sweep as it runs: whole, or (--drop-weights) one width at a time, narrowest
    first, so that a width's weights are gone before the next is trained."""
    if not cfg.drop_weights:
        return [cfg]
    return [replace(cfg, widths=[w]) for w in cfg.widths]


@dataclass
class _Swept:
    """The sweep's SAEs as they are measured, group by group: each one's CE loss
    recovered, scores and decoder digest (against its architecture's reference decoder,
    held here), and the dropping of weights."""

    store: Store
    out: Path
    analysis_cfg: AnalysisConfig
    basis: tuple[str, torch.Tensor] | None
    load_lm: Callable[[], LoadedModel] | None
    ce_sequences: int
    reference_width: int | None  # None: each architecture's narrowest (imported SAEs)
    device: torch.device  # where the digests' products run
    entries: list[SweepEntry] = field(default_factory=list)
    replicates: list[SweepEntry] = field(default_factory=list)
    scores: dict[str, dict[int, Scores]] = field(default_factory=dict)
    again: dict[str, dict[int, list[Scores]]] = field(default_factory=dict)
    digests: dict[str, dict[int, DecoderDigest]] = field(default_factory=dict)
    references: dict[str, tuple[int, torch.Tensor, str | None]] = field(default_factory=dict)
    ce: dict | None = None
    ce_hidden: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # sequences, block L out

    def scores_path(self, e: SweepEntry) -> Path:
        return self.out / "scores" / f"{e.name}.safetensors"

    @property
    def computed_with(self) -> dict:
        """What a dropped SAE's kept scores, digest and CE were computed with: a re-run
        reuses them only where it asks the same."""
        basis = None if self.basis is None else [self.basis[0], self.basis[1].shape[1]]
        return {
            "blocks": self.analysis_cfg.blocks,
            "basis": basis,
            "ce_sequences": self.ce_sequences if self.load_lm else 0,
        }

    def reusable(self, folder: Path, meta: dict) -> bool:
        """Whether what was kept of a dropped SAE serves this run: computed alike, against
        the same reference decoder, its files whole. Else it is trained again."""
        kept, request = meta["dropped"], meta["request"]
        arch, width = request["architecture"], request["width"]
        if any(kept.get(k) != v for k, v in self.computed_with.items()):
            return False
        reference = self.references.get(arch)
        if kept.get("reference_sha256") is not None and (
            reference is None or kept["reference_sha256"] != reference[2]
        ):
            return False
        if width == self.reference_width and kept.get("digest_sha256") is not None:
            return False  # the reference keeps its weights: the wider ones need them
        files = {"scores_sha256": self.out / "scores" / f"{folder.name}.safetensors"}
        files["digest_sha256"] = digest_path(files["scores_sha256"])
        return all(
            kept.get(k) is None or (p.is_file() and sha256_file(p) == kept[k])
            for k, p in files.items()
        )

    def evals(self) -> dict[str, dict[int, dict]]:
        out = {}
        for e in self.entries:
            ev = {**e.meta["eval"], "train_firings": e.meta["train_stats"].get("firings")}
            if self.ce is not None:
                ev["ce_loss_recovered"] = self.ce["saes"][e.name]["ce_loss_recovered"]
            out.setdefault(e.architecture, {})[e.width] = ev
        return out

    def add(self, trained: list[SweepEntry], executor, progress: bool, drop: bool, timed):
        """Measure one group of the sweep's SAEs, one SAE in memory at a time; with drop,
        let their weights go."""
        scored = timed("scores", lambda: self._score(trained, executor, progress))
        # the reference first: the wider ones are compared with it
        for e in sorted(trained, key=lambda e: (e.replicate, e.width)):
            first = e.replicate == 0
            kept = self._measure(e, trained, timed) if first else dict(self.computed_with)
            if drop and not e.dropped and not (first and e.name in self.kept_names):
                e = drop_weights(e, {**kept, **self._hashes(e)})
            if first:
                self.entries.append(e)
                self.scores.setdefault(e.architecture, {})[e.width] = scored[e.name]
            else:
                self.replicates.append(e)
                self.again.setdefault(e.architecture, {}).setdefault(e.width, []).append(
                    scored[e.name]
                )

    def _measure(self, e: SweepEntry, group: list[SweepEntry], timed) -> dict:
        """What one SAE needs its weights for (loaded here, let go on return): its CE
        loss recovered and its decoder's digest; returns what a drop keeps of it."""
        sae = None if e.dropped else load_entry(e).requires_grad_(False)
        reference = self.reference_width or min(
            f.width for f in group if f.architecture == e.architecture
        )
        if e.architecture not in self.references and e.width == reference:
            sha = e.meta.get("weights_sha256")  # none where imported
            assert sae is not None  # a reference's weights are never dropped
            self.references[e.architecture] = (reference, sae.W_dec.detach().cpu(), sha)
        kept = dict(self.computed_with)
        if self.load_lm is not None:
            kept["ce"] = timed("ce_loss_recovered", lambda: self._splice(e, sae))
        d, kept["reference_sha256"] = timed("analysis", lambda: self._digest(e, sae))
        self.digests.setdefault(e.architecture, {})[e.width] = d
        return kept

    @property
    def kept_names(self) -> set[str]:
        """The SAEs whose weights stay: each architecture's reference."""
        return {f"{arch}-w{width}" for arch, (width, _, _) in self.references.items()}

    def _hashes(self, e: SweepEntry) -> dict:
        """sha256 of its kept files: scores, and digest where it has one."""
        path = self.scores_path(e)
        found = {"scores_sha256": sha256_file(path)}
        if e.replicate == 0:
            found["digest_sha256"] = sha256_file(digest_path(path))
        return found

    def _splice(self, e: SweepEntry, sae: SAE | None) -> dict:
        """Its CE loss recovered: spliced into the model (the clean and mean-ablated
        losses, and block L's output, computed once), or as kept where its weights were
        dropped."""
        assert self.load_lm is not None  # only asked for with a model to splice into
        if self.ce_hidden is None:
            seqs = self.store.token_ids("eval", self.ce_sequences)
            layer = self.store.manifest["layer"]
            self.ce_hidden = (seqs, block_outputs(self.load_lm(), layer, seqs))
        seqs, hidden = self.ce_hidden
        lm = self.load_lm()
        if self.ce is None:  # the baseline, with the first SAE whose weights are here
            saes = {} if sae is None else {e.name: sae}
            self.ce = splice_evaluation(lm, self.store, seqs, saes, hidden=hidden)
        elif sae is not None:
            part = splice_evaluation(lm, self.store, seqs, {e.name: sae}, self.ce, hidden)
            self.ce["saes"].update(part["saes"])
        if sae is None:
            self.ce["saes"][e.name] = e.meta["dropped"]["ce"]
        return self.ce["saes"][e.name]

    def _score(self, trained: list[SweepEntry], executor, progress: bool) -> dict[str, Scores]:
        """Every SAE's scores, by name: scored where its weights are at hand, else read."""
        a = self.analysis_cfg
        jobs = [
            ScoreJob(str(self.store.root), str(e.folder), a.blocks, a.read_tokens, str(p))
            for e in trained
            if not e.dropped
            for p in [self.scores_path(e)]
        ]
        executor.map(score_job, jobs, "AtP scores", progress)
        return {
            e.name: load_scores(self.scores_path(e)).normalised(a.atp_normalisation, a.min_firings)
            for e in trained
        }

    def _digest(self, e: SweepEntry, sae: SAE | None) -> tuple[DecoderDigest, str | None]:
        """Its decoder's digest (computed and saved, or read where the weights were
        dropped), and the sha256 of the reference weights it was computed against (None:
        not wider than the reference)."""
        path = digest_path(self.scores_path(e))
        if sae is None:
            return load_digest(path), e.meta["dropped"].get("reference_sha256")
        width, ref_dec, ref_sha = self.references.get(e.architecture, (e.width, None, None))
        wider = e.width > width
        basis = None if self.basis is None else self.basis[1]
        d = digest(sae.W_dec, basis, ref_dec if wider else None, self.device)
        save_digest(d, path)
        return d, ref_sha if wider else None
