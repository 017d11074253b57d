"""Which directions matter, by intervention: keep the top k directions of the residual by
a ranking, mean-ablate the rest at the layer, and measure how far the next-token
distribution moves (KL(clean || edited), nats per prediction) and the loss, over a ladder
of k, on held-out sequences. No erank is this k by definition; this measures it.

Rankings (each a basis B and its dual D, D^T B = I; keeping k directions edits h to
mu + B_k D_k^T (h - mu)):
  raw     the headline Sigma's eigenvectors (orthonormal: the projection is Euclidean)
  act     the activation-weighted ones: B = C^1/2 V, D = C^-1/2 V with V the eigenvectors
          of C^1/2 Sigma C^1/2; B_k D_k^T is the Cov-orthogonal projection onto span B_k,
          which to first order minimises what mean-ablating the rest costs the output
  pca     the activations' principal directions (eigenvectors of C)
  random  a random orthonormal basis (seeded)
C and mu: the eval split's activations, outliers left out as Sigma leaves them out. The
sequences: the train split's first ones, held out from the eval split the rankings are
fitted on. Edits apply where the CE splice edits (not position 0, not outlier norms).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..harvest.store import Store
from ..model.hooks import edited_block, starting_above
from ..model.load import LoadedModel
from .kappa import root
from .sigma import SigmaEstimate, accumulate_parts
from .splice import block_outputs

BARS = (0.05, 0.01)  # KL, nats per prediction: "the output kept"
RANKINGS = {
    "raw": "the headline Sigma's eigenvectors, Euclidean projection",
    "act": "the activation-weighted eigenvectors, Cov-orthogonal projection",
    "pca": "the activations' principal directions",
    "random": "a random orthonormal basis",
}
RELATIVE_FLOOR = 1e-10  # C's eigenvalues below this share of its largest: C^-1/2 is 0 there


class Ranking(NamedTuple):
    basis: torch.Tensor  # [d, d], columns in rank order
    dual: torch.Tensor  # [d, d], dual^T basis = I


def ladder_of(d: int) -> list[int]:
    """0, 8, 16, ... (powers of two below d) and d."""
    ks, k = [0], 8
    while k < d:
        ks.append(k)
        k *= 2
    return [*ks, d]


def _descending(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, vectors = torch.linalg.eigh(matrix.double())
    return values.flip(0), vectors.flip(1)


def inverse_root(c: torch.Tensor) -> torch.Tensor:
    """C^-1/2 on C's range (0 where C's eigenvalues fall below RELATIVE_FLOOR)."""
    values, vectors = torch.linalg.eigh(c.double())
    keep = values > RELATIVE_FLOOR * values.max()
    inv = torch.where(keep, values.clamp_min(1e-300).rsqrt(), torch.zeros_like(values))
    return (vectors * inv) @ vectors.T


def rankings(sigma: torch.Tensor, cov: torch.Tensor, seed: int) -> dict[str, Ranking]:
    """The four rankings of the residual's directions (see the module's docstring)."""
    d = sigma.shape[0]
    _, raw = _descending(sigma)
    half, inv_half = root(cov), inverse_root(cov)
    _, v = _descending(half @ sigma.double() @ half)
    _, pca = _descending(cov)
    gen = torch.Generator(device="cpu").manual_seed(seed + 4241)
    rand, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    return {
        "raw": Ranking(raw, raw),
        "act": Ranking(half @ v, inv_half @ v),
        "pca": Ranking(pca, pca),
        "random": Ranking(rand, rand),
    }


def keep_top(ranking: Ranking, k: int, mu: torch.Tensor):
    """The edit h <- mu + B_k D_k^T (h - mu), as a function of rows of h."""
    b = ranking.basis[:, :k].float()
    dual = ranking.dual[:, :k].float()
    m = mu.float()

    def edit(h: torch.Tensor) -> torch.Tensor:
        return m.to(h.device) + ((h - m.to(h.device)) @ dual.to(h.device)) @ b.T.to(h.device)

    return edit


def activation_moments(store: Store) -> tuple[torch.Tensor, torch.Tensor]:
    """mu and C of the eval split's residual, outliers left out as Sigma leaves them."""
    from ..config import AnalysisConfig

    acts = accumulate_parts((store,), AnalysisConfig(), ("activations",), "cpu")["activations"]
    n = float(acts.n.sum())
    return acts.x.double().sum(0) / n, acts.matrix()


def sigma_of(est: SigmaEstimate) -> torch.Tensor:
    """The plug-in Sigma, rebuilt from its eigendecomposition."""
    assert est.eigenvectors is not None  # measured here, not read back from results.json
    v = est.eigenvectors.double()
    return (v * torch.tensor(est.eigenvalues, dtype=torch.float64)) @ v.T


def ladder(
    lm: LoadedModel, store: Store, est: SigmaEstimate, n_sequences: int, seed: int = 0
) -> dict:
    """results.json's "ladder" at the store's layer, from its headline estimate: KL and
    loss change per ranking and k, the smallest k of the ladder within each bar, beside
    the eranks of both metrics."""
    mu, cov = activation_moments(store)
    twin = est.activation_weighted or {}
    return ladder_at(
        lm,
        store.manifest["layer"],
        sigma_of(est),
        mu,
        cov,
        store.manifest["outliers"]["threshold"],
        store.token_ids("train", n_sequences),
        {"raw": est.erank_corrected, "act": twin.get("erank_corrected")},
        est.reading,
        seed,
    )


@torch.no_grad()
def ladder_at(
    lm: LoadedModel,
    layer: int,
    sigma: torch.Tensor,
    mu: torch.Tensor,
    cov: torch.Tensor,
    threshold: float,
    seqs: torch.Tensor,
    eranks: dict,
    reading: str,
    seed: int = 0,
    batch_size: int = 2,
) -> dict:
    """The ladder at `layer` from Sigma, the activations' mean and covariance, the outlier
    threshold and held-out sequences (as ladder() reads them from a store)."""
    ranked = rankings(sigma, cov, seed)
    ks = ladder_of(sigma.shape[0])
    sums = {name: torch.zeros(len(ks), 2, dtype=torch.float64) for name in ranked}
    clean_loss, count = 0.0, 0
    for ids, hidden in zip(
        seqs.split(batch_size), block_outputs(lm, layer, seqs, batch_size), strict=True
    ):
        ids = ids.to(lm.device)
        masks: list[torch.Tensor] = []
        with (
            starting_above(lm, layer, hidden.to(lm.device)),
            edited_block(lm, layer, None, threshold, masks),
        ):
            clean = lm.model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        mask = masks[0][:, :-1]
        logp = F.log_softmax(clean[mask], -1)
        targets = ids[:, 1:][mask]
        clean_loss += float(F.nll_loss(logp, targets, reduction="sum"))
        count += int(mask.sum())
        none = None  # keeping no direction is the same edit for every ranking
        for name, r in ranked.items():
            for j, k in enumerate(ks):
                if k == 0 and none is not None:
                    sums[name][j] += none
                    continue
                with (
                    starting_above(lm, layer, hidden.to(lm.device)),
                    edited_block(lm, layer, keep_top(r, k, mu), threshold),
                ):
                    edited = lm.model(input_ids=ids, use_cache=False).logits[:, :-1].float()
                logq = F.log_softmax(edited[mask], -1)
                kl = float((logp.exp() * (logp - logq)).sum())
                loss = float(F.nll_loss(logq, targets, reduction="sum"))
                sums[name][j] += torch.tensor([kl, loss], dtype=torch.float64)
                if k == 0:
                    none = torch.tensor([kl, loss], dtype=torch.float64)
    clean_mean = clean_loss / count
    curves = {
        name: {
            "kl": (s[:, 0] / count).tolist(),
            "loss_change": (s[:, 1] / count - clean_mean).tolist(),
            "what": RANKINGS[name],
        }
        for name, s in sums.items()
    }
    return {
        "reading": reading,
        "layer": layer,
        "sequences": int(len(seqs)),
        "split": "train (held out from the eval split the rankings are fitted on)",
        "n_predictions": count,
        "k": ks,
        "clean_loss": clean_mean,
        "rankings": curves,
        "bars": list(BARS),
        "within": {
            name: {str(bar): smallest_within(ks, c["kl"], bar) for bar in BARS}
            for name, c in curves.items()
        },
        "eranks": eranks,
    }


def smallest_within(ks: list[int], kl: list[float], bar: float) -> int | None:
    """The smallest k of the ladder from which on every KL stays within the bar."""
    found = None
    for k, value in zip(reversed(ks), reversed(kl), strict=True):
        if value > bar:
            break
        found = k
    return found
