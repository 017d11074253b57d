"""The profile of every layer from one pass equals single-layer runs at those layers."""

from __future__ import annotations

import math

import pytest

from causaldim.config import AnalysisConfig
from causaldim.errors import UsageError
from causaldim.harvest import harvest
from causaldim.measures import debias, profile
from causaldim.measures.kappa import weighted
from causaldim.measures.sigma import accumulate, estimate, probes_per_token

N_LAYERS = 4
CHECKED = (
    "erank",
    "erank_corrected",
    "erank_corrected_95",
    "participation_ratio_unbiased",
    "n_eff",
    "n_independent",
)


@pytest.fixture(scope="module")
def one_pass(tmp_path_factory, tiny_harvest):
    """A profile of every layer of the tiny Llama from one eval pass, beside single-layer
    stores of layers 0 and 2 harvested apart (each its own pass, down to that layer)."""
    cfg = AnalysisConfig(profile_blocks=8)
    base = tmp_path_factory.mktemp("profile")
    run = tiny_harvest(base / "run", layer=2)
    n_eval = int(run.tokens * run.eval_fraction) // run.seq_len
    acc = profile.Accumulator(
        range(N_LAYERS),
        32,
        n_eval,
        run.seq_len,
        cfg.profile_blocks,
        profile.profile_readings(run.logit_probes, run.fisher_probes),
    )
    harvest(run, progress=False, observer=acc)
    probes = probes_per_token(
        {"logit_probes": run.logit_probes, "fisher_probes": run.fisher_probes}
    )
    found = profile.estimates(acc, cfg, seed=0, probes=probes)
    singles = {
        layer: harvest(tiny_harvest(base / f"L{layer}", layer=layer), progress=False).store
        for layer in (0, 2)
    }
    return cfg, acc, found, singles, probes


def test_every_layer_and_reading_is_measured(one_pass):
    _, acc, found, _, _ = one_pass
    assert sorted(found) == list(range(N_LAYERS))
    for ests in found.values():
        assert set(ests) == {"loss", "logits", "logits_uncentred", "fisher", "activations"}
        for r, e in ests.items():
            assert e.erank > 1
            if r != "activations":
                lo, hi = e.erank_corrected_95
                assert lo <= e.erank_corrected <= hi
    assert not acc.sums  # each layer's sums were freed once estimated


@pytest.mark.parametrize("layer", [0, 2])
def test_profile_equals_a_single_layer_run(one_pass, layer):
    """Same rows, blocks, order and seeds as the store route: the numbers agree to 1e-5
    (the sums differ only in float32 rounding)."""
    cfg, acc, found, singles, probes = one_pass
    light = AnalysisConfig(blocks=cfg.profile_blocks)
    sums = accumulate(singles[layer], light)
    assert list(sums) == list(found[layer])  # the readings in the seeds' order
    for k, (r, s) in enumerate(sums.items()):
        single = estimate(r, s, light, k, probes.get(r, 1), debias.LIGHT)
        for name in CHECKED:
            a, b = getattr(found[layer][r], name), getattr(single, name)
            if a is None:
                assert b is None
                continue
            pairs = zip(a, b, strict=True) if isinstance(a, list) else [(a, b)]
            assert all(math.isclose(x, y, rel_tol=1e-5) for x, y in pairs), (layer, r, name, a, b)
        assert found[layer][r].n_samples == single.n_samples


@pytest.mark.parametrize("layer", [0, 2])
def test_the_profiles_activation_weighted_twins_equal_the_store_routes(one_pass, layer):
    """The metric pass's C and the eval pass's rows summed as C^1/2 u give what the store
    route gives from the store's h and u (float32 rounding apart)."""
    cfg, _, found, singles, _ = one_pass
    light = AnalysisConfig(blocks=cfg.profile_blocks)
    sums = accumulate(singles[layer], light)
    twins = weighted([singles[layer]], light, sums, 0, budget=debias.LIGHT)
    assert set(twins) == {"loss", "logits", "logits_uncentred", "fisher"}
    for r, twin in twins.items():
        mine = found[layer][r].activation_weighted
        for name in CHECKED:
            a, b = mine[name], getattr(twin, name)
            pairs = zip(a, b, strict=True) if isinstance(a, list) else [(a, b)]
            assert all(math.isclose(x, y, rel_tol=1e-4) for x, y in pairs), (layer, r, name, a, b)


def test_the_profile_pass_reuses_finished_stores(one_pass, tiny_harvest, tmp_path):
    """With every store finished, only the eval split runs, and the store is untouched."""
    cfg, _, found, singles, probes = one_pass
    root = singles[2].root
    before = sorted(p.stat().st_mtime for p in root.iterdir())
    acc = profile.Accumulator(
        range(N_LAYERS),
        32,
        acc_sequences(singles[2]),
        32,
        cfg.profile_blocks,
        profile.profile_readings(1, 1),
    )
    result = harvest(tiny_harvest(root.parent.parent, layer=2), progress=False, observer=acc)
    assert result.reused and result.lm is not None
    assert sorted(p.stat().st_mtime for p in root.iterdir()) == before
    again = profile.estimates(acc, cfg, seed=0, probes=probes)
    assert again[1]["loss"].erank == pytest.approx(found[1]["loss"].erank, rel=1e-5)


def acc_sequences(store) -> int:
    return store.manifest["splits"]["eval"]["n_sequences"]


def test_memory_check_names_the_fix():
    with pytest.raises(UsageError, match="--profile-blocks 3"):
        profile.check_memory(30, 576, 16, 4, profile.sums_bytes(30, 576, 3, 4) + 1, "the CPU")
    with pytest.raises(UsageError, match="drop --profile"):
        profile.check_memory(30, 576, 16, 4, 10, "the CPU")
    profile.check_memory(30, 576, 16, 4, profile.sums_bytes(30, 576, 16, 4), "the CPU")
