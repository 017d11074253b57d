"""Training one SAE from a stream of activations, with matched L0.

TopK reaches its L0 by construction; JumpReLU and ReLU reach a target L0 by a
multiplicative controller on their sparsity coefficient. Inputs are normalised to zero
mean and E||x||^2 = d while training (the normalisation is folded into the weights at
the end). Dead features (no firing for `dead_tokens` tokens) are counted; for TopK the
AuxK loss revives them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from ..faults import fault_point
from .base import SAE
from .checkpoint import Checkpoint
from .optim import build_optimizer
from .sparse import StepInputs


@dataclass
class TrainSettings:
    lr: float = 4e-4
    epochs: int = 1
    target_l0: float = 32.0
    init_coef: float | None = None  # starting sparsity coefficient; None: the architecture's
    controller_rate: float = 0.05  # per-step log change of the coefficient per unit log L0 error
    dead_tokens: int = 200_000
    aux_k: int = 256
    aux_coef: float = 1 / 32
    decay_fraction: float = 0.2  # the learning rate falls linearly to 0 over this tail
    seed: int = 0
    compute_dtype: str = "float32"  # the dense encoder product; weights stay float32
    optimizer: str = "adam"  # "lean": LeanAdam on sparse row gradients (optim.py)

    def to_dict(self) -> dict:
        # SAEs trained before the optimiser was a choice were trained with "adam": their
        # requests (which reuse compares) stay what they were
        return {k: v for k, v in asdict(self).items() if k != "optimizer" or v != "adam"}


class TrainStats(NamedTuple):
    steps: int
    tokens: int
    final_mse: float  # normalised units, per token
    final_l0: float  # mean over the last steps
    sparsity_coef: float
    dead_fraction: float
    history: list[dict]
    # Over the whole training (tokens x epochs): quantiles of each feature's firing count;
    # too few firings per feature means too little data for the width.
    firings: dict


class Normalizer(NamedTuple):
    mean: torch.Tensor
    scale: float

    @classmethod
    def fit(cls, x: torch.Tensor) -> Normalizer:
        mean = x.mean(0)
        scale = float(((x - mean).pow(2).sum(-1).mean() / x.shape[1]).sqrt())
        return cls(mean, scale)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale

    def to(self, device) -> Normalizer:
        return Normalizer(self.mean.to(device), self.scale)


def train_sae(
    sae: SAE,
    batches: Callable[[], Iterable[torch.Tensor]],
    settings: TrainSettings,
    total_steps: int,
    normalizer: Normalizer,
    held_out: torch.Tensor | None = None,
    checkpoint: Checkpoint | None = None,
) -> TrainStats:
    """Train in place on normalised batches; fold the normalisation in at the end. With
    `held_out` tokens, a final uniform shift of the firing bars matches L0 exactly. With
    a checkpoint, the state is saved every checkpoint.every steps and a saved state of
    the same request is resumed from: batches() must give the same batches each epoch.
    Batches, held_out and the normaliser must be on the SAE's device."""
    gen = torch.Generator().manual_seed(settings.seed)  # on the CPU: the same on any device
    sae.reset(gen)
    opt = build_optimizer(settings.optimizer, sae.parameters(), settings.lr)
    decay_start = int(total_steps * (1 - settings.decay_fraction))
    coef = sae.init_sparsity_coef if settings.init_coef is None else settings.init_coef
    device = sae.b_dec.device
    since_fired = torch.zeros(sae.cfg.width, dtype=torch.long, device=device)
    fired = torch.zeros(sae.cfg.width, dtype=torch.long, device=device)
    dtype = getattr(torch, settings.compute_dtype)
    step, tokens, history, recent = 0, 0, [], []
    first, done = True, (-1, -1)  # (epoch, batch) of the last step taken before a resume
    if checkpoint is not None and (saved := checkpoint.load()) is not None:
        tensors, state = saved
        _restore(sae, opt, gen, tensors, state)
        since_fired = tensors["since_fired"].to(device)
        fired = tensors["fired"].to(device)
        step, tokens, coef, first = state["step"], state["tokens"], state["coef"], False
        history, recent = state["history"], [tuple(r) for r in state["recent"]]
        done = tuple(state["done"])
    for epoch in range(settings.epochs):
        for position, raw in enumerate(batches()):
            if (epoch, position) <= done:
                continue  # consumed before the checkpoint
            x = normalizer(raw)
            if first:  # b_dec starts at the data's centre, sparsity at the target
                with torch.no_grad():
                    sae.b_dec.copy_(x.mean(0))
                    if not sae.fixed_l0:
                        sae.calibrate(x, settings.target_l0)
                first = False
            lr = settings.lr * min(1.0, (total_steps - step) / max(1, total_steps - decay_start))
            for group in opt.param_groups:
                group["lr"] = lr
            dead = since_fired > settings.dead_tokens  # as of the last step: for AuxK
            step_inputs = StepInputs(
                dtype,
                coef,
                dead if dead.any() else None,
                settings.aux_k,
                settings.aux_coef,
                sparse_grads=settings.optimizer == "lean",
            )
            out = sae.train_forward(x, step_inputs)
            side = out.side_loss
            mse = (out.x_hat - x).pow(2).sum(-1).mean()
            loss = mse + side
            active_idx = out.idx[out.vals > 0]
            n_active = len(active_idx)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            sae.remove_parallel_grad()
            opt.step()
            sae.normalize_decoder()

            since_fired += len(x)
            since_fired[active_idx] = 0
            fired += torch.bincount(active_idx, minlength=sae.cfg.width)
            dead = since_fired > settings.dead_tokens
            mse_value = mse.item()
            if not math.isfinite(mse_value + float(side.detach())):
                raise FloatingPointError(
                    f"non-finite SAE loss at step {step + 1} ({sae.architecture}, width "
                    f"{sae.cfg.width}); the store's train split or --lr is the likely cause"
                )
            l0 = n_active / len(x)
            if not sae.fixed_l0:  # integral control of the coefficient toward the target L0
                error = math.log(max(l0, 1e-3) / settings.target_l0)
                coef *= math.exp(settings.controller_rate * max(-1.0, min(1.0, error)))
            step += 1
            tokens += len(x)
            recent = (recent + [(mse_value, l0)])[-20:]
            if step % 25 == 0 or step == 1:
                history.append(
                    {
                        "step": step,
                        "mse": mse_value,
                        "l0": l0,
                        "coef": coef,
                        "dead": int(dead.sum()),
                    }
                )
            if checkpoint is not None and checkpoint.due(step):
                tensors, state = _snapshot(sae, opt, gen, since_fired, fired)
                state.update(
                    step=step,
                    tokens=tokens,
                    coef=coef,
                    history=history,
                    recent=recent,
                    done=[epoch, position],
                )
                checkpoint.save(tensors, state)
            fault_point("train.step")
    if held_out is not None:
        match_l0(sae, normalizer(held_out), settings.target_l0)
    with torch.no_grad():
        sae.fold_normalization(normalizer.mean, normalizer.scale)
    n = max(1, len(recent))
    return TrainStats(
        step,
        tokens,
        sum(r[0] for r in recent) / n,
        sum(r[1] for r in recent) / n,
        coef,
        float((since_fired > settings.dead_tokens).float().mean()),
        history,
        firing_quantiles(fired),
    )


def firing_quantiles(fired: torch.Tensor) -> dict:
    """Median, 10th and 90th percentile and mean of per-feature firing counts."""
    x = fired.double().cpu()
    q = torch.quantile(x, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device="cpu"))
    return {"p10": float(q[0]), "median": float(q[1]), "p90": float(q[2]), "mean": float(x.mean())}


def _snapshot(sae: SAE, opt: torch.optim.Optimizer, gen: torch.Generator, since_fired, fired):
    """Tensors (on the CPU) and JSON state that make the rest of training bit-identical."""
    opt_state = opt.state_dict()
    tensors = {f"sae.{k}": v.cpu() for k, v in sae.state_dict().items()}
    for i, slots in opt_state["state"].items():
        for name, value in slots.items():
            tensors[f"opt.{i}.{name}"] = value.cpu()
    tensors["since_fired"] = since_fired.cpu()
    tensors["fired"] = fired.cpu()
    tensors["generator"] = gen.get_state()
    return tensors, {"param_groups": opt_state["param_groups"]}


def _restore(sae: SAE, opt, gen: torch.Generator, tensors: dict, state: dict) -> None:
    sae.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("sae.")})
    slots: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            slots.setdefault(int(i), {})[name] = value
    opt.load_state_dict({"state": slots, "param_groups": state["param_groups"]})
    gen.set_state(tensors["generator"])


@torch.no_grad()
def match_l0(sae: SAE, x: torch.Tensor, target: float, iters: int = 40) -> float:
    """Bisect one shift of every feature's firing bar so that mean L0 on x hits target:
    the controller gets close during training, this makes the match exact (nothing to do
    where L0 is fixed by construction)."""
    if sae.fixed_l0:
        return 0.0

    def l0_at(delta: float) -> float:
        sae.shift_sparsity(delta)
        l0 = float((sae.encode(x) > 0).sum(-1).float().mean())
        sae.shift_sparsity(-delta)
        return l0

    lo, hi = -1.0, 1.0
    while l0_at(lo) < target and lo > -64:
        lo *= 2
    while l0_at(hi) > target and hi < 64:
        hi *= 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if l0_at(mid) > target else (lo, mid)
    delta = (lo + hi) / 2
    sae.shift_sparsity(delta)
    return delta
