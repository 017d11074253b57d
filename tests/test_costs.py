"""The dry run's time estimate: work counted in three kinds, divided by speeds measured
here at the run's shapes (or a planned GPU's stated ones)."""

from __future__ import annotations

import pytest
import torch

from causaldim import costs, disk
from causaldim.devices import PROFILES, planning_for


def test_calibration_times_this_machine_at_the_runs_shapes():
    rates = costs.calibrate(d=64, d_ff=256, model_rows=512, sae_rows=256, width=1024)
    assert rates.source == "measured here"
    assert rates.model > 1e6 and rates.sae > 1e6 and 0 < rates.eig < 1


def test_a_planned_gpu_is_not_timed_but_taken_at_its_stated_speed():
    with planning_for("h100"):
        rates = costs.calibrate(64, 256, 512, 256, 1024, "bfloat16", "float32", "cuda")
    stated = PROFILES["h100"].matmul_flops
    assert (rates.model, rates.sae) == (stated["bfloat16"], stated["float32"])
    assert rates.source.startswith("stated for ")


def test_each_kind_of_work_is_divided_by_its_own_speed():
    rates = costs.Rates(model=1e9, sae=2e9, eig=0.01, source="given")
    model = costs.Work(model=costs.MODEL_EFFICIENCY * 1e9)  # 1 s of model products
    sae = costs.Work(sae=costs.SAE_EFFICIENCY * 4e9)  # 2 s of SAE products
    eigs = costs.Work(eigs=100 / costs.EIG_OVERHEAD)  # 1 s of eigendecompositions
    assert rates.seconds(model) == pytest.approx(1.0)
    assert rates.seconds(sae) == pytest.approx(2.0)
    assert rates.seconds(eigs) == pytest.approx(1.0)
    assert rates.seconds(model + 2 * sae + eigs) == pytest.approx(6.0)
    assert rates._replace(model=2e9).seconds(model) == pytest.approx(0.5)


def test_the_saes_disk_follows_their_saved_precision(tiny_model, tmp_path):
    from causaldim.config import HarvestConfig
    from causaldim.harvest.plan import plan
    from causaldim.sweep_config import SweepConfig

    the_plan = plan(
        HarvestConfig(model=tiny_model("llama"), tokens=1280, out=str(tmp_path / "run"))
    )
    d, widths = the_plan.source.d_model, [1024, 4096]
    full = disk.disk_bytes(the_plan, SweepConfig(widths=widths))
    half = disk.disk_bytes(the_plan, SweepConfig(widths=widths, save_dtype="bfloat16"))
    assert full["saes"] == (2 * d * 4 + 12) * sum(widths)
    assert half["saes"] == (2 * d * 2 + 12) * sum(widths)
    # training keeps float32 weights and moments: two checkpoints at a save, or none
    checkpoint = disk.checkpoint_bytes(d, max(widths), "adam")
    assert full["checkpoint"] == half["checkpoint"] == 2 * checkpoint
    none = disk.disk_bytes(the_plan, SweepConfig(widths=widths, checkpoint_steps=0))
    assert none["checkpoint"] == 0 and none["total"] == full["total"] - 2 * checkpoint
    assert full["total"] == full["store"] + full["saes"] + full["scores"] + full["checkpoint"]
    # --drop-weights: the reference beside the widest, and the other figure stated too
    drop = disk.disk_bytes(the_plan, SweepConfig(widths=widths, drop_weights=True))
    assert drop["saes"] == (2 * d * 4 + 12) * sum(widths) == full["saes"]  # two widths
    three = SweepConfig(widths=[256, *widths], drop_weights=True)
    drop = disk.disk_bytes(the_plan, three)
    assert drop["saes"] == (2 * d * 4 + 12) * (256 + 4096)
    assert drop["saes_other"] == (2 * d * 4 + 12) * (256 + 1024 + 4096)


def test_scores_and_digests_take_the_bytes_planned(tmp_path):
    from causaldim.measures.digest import digest, digest_path, save_digest
    from causaldim.measures.score import Scores, save_scores

    d, width, blocks, ref = 48, 3000, 24, 700
    scores = Scores(
        torch.rand(blocks, width, dtype=torch.float64),
        torch.rand(blocks, width, dtype=torch.float64),
        torch.ones(blocks, dtype=torch.long),
        torch.ones(blocks, dtype=torch.long),
        torch.rand(min(blocks, 16), d, d, dtype=torch.float64),
    )
    path = tmp_path / "s.safetensors"
    save_scores(scores, path)
    assert path.stat().st_size == pytest.approx(disk.scores_bytes(d, width, blocks), rel=0.01)
    basis = torch.linalg.qr(torch.randn(d, 5))[0]
    save_digest(digest(torch.randn(width, d), basis, torch.randn(ref, d)), digest_path(path))
    size = digest_path(path).stat().st_size
    assert disk.digest_bytes(width) * 0.8 < size <= disk.digest_bytes(width) + 1000


def test_each_costly_control_is_timed_and_the_nulls_grow_with_the_eval_split(tiny_model, tmp_path):
    from causaldim.config import AnalysisConfig, HarvestConfig
    from causaldim.harvest.plan import plan
    from causaldim.sweep_config import SweepConfig

    rates = costs.Rates(model=1e9, sae=2e9, eig=0.01, source="given")
    model = tiny_model("llama")

    def seconds(eval_fraction: float) -> dict:
        cfg = HarvestConfig(
            model=model, tokens=2560, eval_fraction=eval_fraction, out=str(tmp_path / "r")
        )
        analysis = AnalysisConfig(controls=["all"])
        the_plan = plan(cfg, extra_layers=(0,))  # the depth control's other layer
        return costs.estimate(the_plan, SweepConfig(widths=[16]), analysis, rates)["seconds"]

    small, large = seconds(0.2), seconds(0.6)
    for stage in ("ablation", "task", "depth", "four_cell", "nulls", "synthetic"):
        assert small[f"control.{stage}"] > 0, stage
    # each untrained network: one headline pass over the eval split (at a tiny model's
    # shapes the corrections' eigendecompositions, the same for any split, weigh most)
    assert large["control.nulls"] > small["control.nulls"]
