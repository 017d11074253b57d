"""Direct Sigma estimates: planted spectra, exact Jacobians, and the store pass."""

from __future__ import annotations

import math

import pytest
import torch

from causaldim.config import AnalysisConfig
from causaldim.harvest import harvest
from causaldim.harvest.model_pass import fisher_probes_for, gaussian_probes, grads_at
from causaldim.measures.kappa import measure
from causaldim.measures.sigma import BlockSums, accumulate, estimate, spectrum
from causaldim.model.load import load_model, resolve_model

D = 48


def planted(kind: str) -> torch.Tensor:
    i = torch.arange(1, D + 1, dtype=torch.float64)
    if kind == "flat":
        return torch.ones(D, dtype=torch.float64)
    if kind == "power-law":
        return i**-1.0
    if kind == "low-rank+noise":
        return torch.where(i <= 8, 1.0, 0.01)
    raise ValueError(kind)


def readout(lam: torch.Tensor, vocab: int, orthogonal_to_ones: bool = False):
    """W [vocab, D] with W^T W = R diag(lam) R^T, R a random rotation."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(vocab, D, generator=gen, dtype=torch.float64)
    if orthogonal_to_ones:  # so that the softmax's null direction (all ones) is not read
        q -= q.mean(0, keepdim=True)
    q, _ = torch.linalg.qr(q)
    r, _ = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
    return (q * lam.sqrt()) @ r.T


def samples(reading: str, w: torch.Tensor, n: int) -> torch.Tensor:
    """Rank-1 samples u [n, D] from each estimator's own code path."""
    gen = torch.Generator().manual_seed(2)
    w = w.float()
    h = torch.randn(n, D, generator=gen) if reading != "fisher" else torch.zeros(n, D)
    h.requires_grad_(True)
    logits = h @ w.T
    if reading == "loss":  # squared error against a noisy target: g = -W^T eps
        target = (logits + torch.randn(logits.shape, generator=gen)).detach()
        (g,) = torch.autograd.grad(0.5 * ((logits - target) ** 2).sum(), h)
        return g
    if reading == "logits":
        probes, _ = gaussian_probes(logits, 1, gen)  # the centred parts
    else:
        probes = fisher_probes_for(logits, 1, gen)
    (u,) = torch.autograd.grad(logits, h, probes[0])
    return u


@pytest.mark.parametrize("kind", ["flat", "power-law", "low-rank+noise"])
@pytest.mark.parametrize("reading", ["loss", "logits", "fisher"])
def test_planted_erank_and_pr_within_2_percent(kind, reading):
    lam = planted(kind)
    # the softmax (fisher) and the centred probes (logits) do not read the all-ones direction
    w = readout(lam, vocab=4 * D, orthogonal_to_ones=(reading != "loss"))
    u = samples(reading, w, n=300 * D)
    sums = BlockSums(D, blocks=16)
    for b, chunk in enumerate(u.chunk(16)):
        sums.add(b, chunk)
    est = estimate(reading, sums, AnalysisConfig())
    truth = spectrum(lam)
    assert abs(est.erank / truth.erank - 1) < 0.02, (est.erank, truth.erank)
    assert abs(est.participation_ratio / truth.participation_ratio - 1) < 0.02
    # The corrected erank, at 300 independent samples per dimension: converged, within 1%,
    # its interval covering the planted value.
    assert est.converged and abs(est.erank_corrected / truth.erank - 1) < 0.01
    lo, hi = est.erank_corrected_95
    at_d = kind == "flat" and hi > 0.999 * D  # erank = d, the bound: the interval reaches it
    assert lo <= truth.erank <= hi or at_d, (lo, hi)
    assert est.warning is None and est.n_samples == 300 * D


def test_spectrum_of_known_matrices():
    flat = spectrum(torch.ones(10))
    assert flat.erank == pytest.approx(10) and flat.participation_ratio == pytest.approx(10)
    one = spectrum(torch.tensor([5.0, 0, 0]))
    assert one.erank == pytest.approx(1) and one.directions_for == {"50%": 1, "90%": 1, "99%": 1}
    two = spectrum(torch.tensor([3.0, 1.0]))
    p = torch.tensor([0.75, 0.25])
    assert two.erank == pytest.approx(math.exp(float(-(p * p.log()).sum())))
    assert two.participation_ratio == pytest.approx(16 / 10)
    assert two.participation_ratio <= two.erank


def test_few_samples_are_flagged():
    sums = BlockSums(D, blocks=2)
    sums.add(0, torch.randn(30, D))
    sums.add(1, torch.randn(30, D))
    est = estimate("logits", sums, AnalysisConfig())
    assert est.converged is False and est.warning.startswith("not converged: ")
    assert f"about {est.eval_tokens_needed:,} eval tokens would do" in est.warning


# ---------------------------------------------------------------- exact J^T J, tiny model


def _logits_of_h(lm, layer, ids):
    """f(h) = all logits, with block `layer`'s output replaced by h."""

    def f(h):
        handle = lm.layers[layer].register_forward_hook(
            lambda m, a, out: (h, *out[1:]) if isinstance(out, tuple) else h
        )
        try:
            return lm.model(input_ids=ids, use_cache=False).logits
        finally:
            handle.remove()

    return f


@pytest.fixture(scope="module")
def tiny_exact(tiny_model):
    lm = load_model(resolve_model(tiny_model("llama")))
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(3))
    layer = 1
    out = grads_at(lm, (layer,), ids)[layer]
    jac = torch.autograd.functional.jacobian(_logits_of_h(lm, layer, ids), out.h)
    t, d = ids.shape[1], out.h.shape[-1]
    jac = jac.reshape(t, -1, t, d)  # [out position, vocab, in position, d]
    per_pos = jac.permute(2, 0, 1, 3).reshape(t, -1, d)  # J_t: all outputs w.r.t. h_t
    exact = torch.einsum("tod,toe->de", per_pos, per_pos) / t
    # the centred probes' Sigma: J^T (I - 1 1^T / V) J at each output position
    per_out = jac.reshape(t, -1, t, d)
    summed = per_out.sum(1)  # [out position, in position, d]: 1^T J
    centred = exact - torch.einsum("std,ste->de", summed, summed) / (t * per_out.shape[1])
    logits = _logits_of_h(lm, layer, ids)(out.h).detach()
    p = logits.softmax(-1)[0]  # [T, V]
    cov = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    jac_s = jac[:, :, :, :]  # [s, v, t, d]
    fisher = torch.einsum("svtd,svw,swte->de", jac_s, cov, jac_s) / t
    return lm, layer, ids, {"logits": centred, "logits_uncentred": exact, "fisher": fisher}


@pytest.mark.parametrize("reading", ["logits", "logits_uncentred", "fisher"])
def test_probes_match_exact_pullback_with_monte_carlo_error(tiny_exact, reading):
    lm, layer, ids, exact_of = tiny_exact
    exact = exact_of[reading]
    gen = torch.Generator().manual_seed(4)
    draws = []  # one probe per draw: X_k = mean_t u_t u_t^T
    for _ in range(64):
        probes = (0, 4) if reading == "fisher" else (4, 0)
        out = grads_at(lm, (layer,), ids, *probes, generator=gen)[layer]
        u = {  # [1, T, 4, d]
            "logits": out.u_logits,
            "logits_uncentred": None if out.u_logits is None else out.u_logits + out.u_shift,
            "fisher": out.u_fisher,
        }[reading]
        for k in range(4):
            uk = u[0, :, k]
            draws.append(uk.T @ uk / uk.shape[0])
    draws = torch.stack(draws)
    per_draw_sq = float(((draws - exact) ** 2).sum((1, 2)).mean())  # E||X - Sigma||_F^2

    errors = {}
    for k in (4, 16, 64, 256):
        est = draws[:k].mean(0)
        expected = math.sqrt(per_draw_sq / k)  # Monte Carlo error of a mean of k draws
        errors[k] = float((est - exact).norm())
        assert errors[k] < 3 * expected, (k, errors[k], expected)
    # Unbiased, and the error falls like 1/sqrt(K): a slope near -1/2 on log-log axes.
    ks = torch.tensor(list(errors), dtype=torch.float64).log()
    es = torch.tensor(list(errors.values()), dtype=torch.float64).log()
    slope = float(((ks - ks.mean()) * (es - es.mean())).sum() / ((ks - ks.mean()) ** 2).sum())
    assert -0.8 < slope < -0.25, slope
    assert errors[256] / float(exact.norm()) < 0.15


# ---------------------------------------------------------------- through the store


@pytest.fixture
def store(harvest_config):
    cfg = harvest_config(tokens=4096, eval_fraction=0.125, logit_probes=2, fisher_probes=1)
    return harvest(cfg, progress=False).store


def test_store_pass_accumulates_the_stored_samples(store):
    cfg = AnalysisConfig(blocks=4)
    sums = accumulate(store, cfg)
    assert set(sums) == {"loss", "logits", "logits_uncentred", "fisher", "activations"}
    rows = {k: [] for k in ("g", "u_logits", "h", "pos")}
    for b in store.batches("eval", tuple(rows), 10_000):
        for k in rows:
            rows[k].append(b[k])
    rows = {k: torch.cat(v) for k, v in rows.items()}
    g = rows["g"][rows["pos"] < 31]
    assert torch.allclose(sums["loss"].matrix(), (g.T @ g).double() / len(g), rtol=1e-4)
    u = rows["u_logits"].reshape(-1, 32)
    expected = (u.T @ u).double() / len(u)
    scale = float(expected.abs().max())  # float32 sums: entries near 0 carry absolute error
    assert torch.allclose(sums["logits"].matrix(), expected, rtol=1e-4, atol=1e-6 * scale)
    h = rows["h"].double()
    assert torch.allclose(
        sums["activations"].matrix(), torch.cov(h.T, correction=0), rtol=1e-4, atol=1e-8
    )


def test_measure_reports_every_reading_with_intervals(store):
    results = measure(store, AnalysisConfig())
    n_eval = store.n_tokens("eval", drop_outliers=True)
    assert results["logits"].n_samples == 2 * n_eval and results["logits"].n_tokens == n_eval
    assert results["logits_uncentred"].n_samples == 2 * n_eval
    assert 0 < results["logits_uncentred"].common_mode_share < 1
    assert results["fisher"].n_samples == n_eval
    assert results["loss"].n_samples < n_eval  # the last positions predict nothing
    for reading, est in results.items():
        if reading != "activations":
            lo, hi = est.erank_corrected_95
            assert lo <= est.erank_corrected <= hi and est.converged is not None
            twin = est.activation_weighted  # the same reading in the activations' metric
            lo, hi = twin["erank_corrected_95"]
            assert lo <= twin["erank_corrected"] <= hi and twin["n_samples"] == est.n_samples
            assert twin["definition"].startswith("erank(C^1/2 ")
        assert est.participation_ratio <= est.erank + 1e-9
        assert est.convergence[-1]["n_samples"] == est.n_samples
        assert set(est.split_half) == {"first", "second"}
        assert len(est.eigenvalues) == 32


def test_planted_jacobian_through_the_model_pass(tiny_model):
    """A real model whose blocks after L are identities and whose head is a planted
    read-out: J = W exactly, so Sigma_logits = W^T W."""
    lm = load_model(resolve_model(tiny_model("llama")))
    layer = 1
    for block in lm.layers[layer + 1 :]:
        block.self_attn.o_proj.weight.data.zero_()
        block.mlp.down_proj.weight.data.zero_()
    lm.model.model.norm = torch.nn.Identity()
    lam = torch.arange(1, 33, dtype=torch.float64) ** -0.7
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(320, 32, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(q - q.mean(0))  # columns orthogonal to the all-ones direction
    lm.model.lm_head.weight.data = (q * lam.sqrt()).float()  # W^T P W = W^T W = diag(lam)
    sums = BlockSums(32, 8)
    for i in range(32):
        ids = torch.randint(0, 320, (8, 32), generator=gen)
        out = grads_at(lm, (layer,), ids, logit_probes=1, generator=gen)[layer]
        sums.add(i % 8, out.u_logits.reshape(-1, 32))
    est = estimate("logits", sums, AnalysisConfig())
    truth = spectrum(lam)
    assert est.n_samples == 32 * 8 * 32
    assert abs(est.erank / truth.erank - 1) < 0.02
    assert abs(est.participation_ratio / truth.participation_ratio - 1) < 0.02


def test_a_shift_of_the_unembedding_moves_only_the_uncentred_reading(tiny_model):
    """W_U + 1 a^T adds (a . h) to every logit, which leaves the softmax of every input
    unchanged: the gauge-invariant logits reading, the fisher and the loss readings stay
    equal to float error with the same probes; the paper's literal uncentred one moves."""
    lm = load_model(resolve_model(tiny_model("llama")))
    assert lm.model.lm_head.weight is not lm.model.get_input_embeddings().weight
    layer = 1
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(8))

    def pass_():
        gen = torch.Generator().manual_seed(9)
        return grads_at(lm, (layer,), ids, 2, 2, gen)[layer]

    before = pass_()
    probs = lm.model(input_ids=ids, use_cache=False).logits.softmax(-1).detach()
    a = 0.5 * torch.randn(32, generator=torch.Generator().manual_seed(10))
    lm.model.lm_head.weight.data += torch.ones(320, 1) * a[None, :]
    after = pass_()
    shifted = lm.model(input_ids=ids, use_cache=False).logits.softmax(-1).detach()
    assert torch.allclose(probs, shifted, atol=1e-6)

    def close(x, y):
        return torch.allclose(x, y, rtol=1e-3, atol=1e-4 * float(x.abs().max()))

    assert close(before.g, after.g)
    assert close(before.u_logits, after.u_logits)
    assert close(before.u_fisher, after.u_fisher)
    uncentred_before = before.u_logits + before.u_shift
    uncentred_after = after.u_logits + after.u_shift
    assert not close(uncentred_before, uncentred_after)
    moved = (uncentred_after - uncentred_before).norm() / uncentred_before.norm()
    assert float(moved) > 0.1


def test_fisher_probes_draw_y_from_the_softmax():
    logits = torch.tensor([[[2.0, 0.0, -1.0, 1.0, -3.0]]]).expand(1, 20_000, 5)
    (v,) = fisher_probes_for(logits, 1, torch.Generator().manual_seed(0))
    p = logits[0, 0].softmax(-1)
    onehot = v[0] + p  # v = onehot(y) - p
    assert torch.allclose(onehot.sum(-1), torch.ones(20_000))
    freq = onehot.mean(0)
    assert torch.allclose(freq, p, atol=4 * float((p * (1 - p) / 20_000).sqrt().max()))
