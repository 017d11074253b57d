"""The sweep on Ray gives the in-process numbers, also when a worker dies mid-job."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
from conftest import seed_store
from test_faults import args_for, numbers

from causaldim import cli
from causaldim.executors import RayExecutor
from causaldim.faults import ENV, ONCE

ray = pytest.importorskip("ray")

SWEEP = ["--widths", "16", "32", "64"]  # three independent training jobs


def differences(a, b, path: str = "") -> list[str]:
    """Where two results.json differ in their numbers (where the jobs ran is no number).
    Counts, choices and text must be equal. A Ray task computes with one thread, and
    float32 sums taken in another order move the last digits of a float (1e-6 relative
    in the smoke run): floats must agree to 1e-4 relative (1e-6 absolute near 0)."""
    if path == "":
        a, b = numbers(copy.deepcopy(a)), numbers(copy.deepcopy(b))
        for r in (a, b):
            r["config"]["sweep"].pop("executor")
            r["config"]["sweep"].pop("ray_address")
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        close = math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6) or (a != a and b != b)
        return [] if close else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"[:200]]


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_model, text_corpus):
    out = tmp_path_factory.mktemp("local") / "run"
    assert cli.main([*args_for(tiny_model("llama"), text_corpus, out), *SWEEP]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture
def cluster(request):
    """A fresh local Ray instance with 2 CPUs, started with the environment given."""

    def start(env: dict[str, str], gpus: int = 0):
        os.environ.update(env)  # workers inherit the driver's environment when they start
        ray.init(num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False)

    yield start
    ray.shutdown()
    for name in (ENV, ONCE):
        os.environ.pop(name, None)


@pytest.mark.slow
def test_the_smoke_preset_on_ray_gives_the_in_process_numbers(smoke_run, cluster, tmp_path):
    """The in-process numbers are the session's smoke run (conftest.smoke_run); the Ray run
    starts from its store (the same harvest: the sweep is what runs on Ray)."""
    run, smoke_local = smoke_run
    out = tmp_path / "run"
    seed_store(run, out)
    cluster({})
    args = ["--quiet", "run", "--preset", "smoke", "--out", str(out), "--executor", "ray"]
    assert cli.main(args) == 0
    assert differences(json.loads((out / "results.json").read_text()), smoke_local) == []


@pytest.mark.slow
def test_a_worker_killed_mid_job_is_retried_and_resumes(
    local_run, cluster, tmp_path, tiny_model, text_corpus
):
    fired = tmp_path / "fired"
    cluster({ENV: "train.step:12:kill", ONCE: str(fired)})
    out = tmp_path / "run"
    args = [*args_for(tiny_model("llama"), text_corpus, out), *SWEEP, "--executor", "ray"]
    assert cli.main(args) == 0
    assert fired.exists()  # a worker was killed at its 12th training step
    assert differences(json.loads((out / "results.json").read_text()), local_run) == []


def test_with_gpus_each_job_gets_its_own_and_resolves_its_device_there(cluster):
    """Two GPUs declared (Ray schedules by the count; none need exist): each job holds
    one, two run at once on different ones, and each is told 'auto', resolved in the
    worker to the GPU Ray made visible to it. With --device cpu no GPU is asked for."""

    def where(job, device):
        import time

        time.sleep(1.0)  # long enough that two jobs overlap
        return device, ray.get_gpu_ids()

    cluster({}, gpus=2)
    on_gpus = RayExecutor(device="cuda")
    assert on_gpus.gpus_per_job() == 1.0
    got = on_gpus.map(where, list(range(4)))
    assert [device for device, _ in got] == ["auto"] * 4
    assert all(len(ids) == 1 for _, ids in got)
    assert {ids[0] for _, ids in got} == {0, 1}
    on_cpus = RayExecutor(device="cpu")
    assert on_cpus.gpus_per_job() == 0.0
    assert on_cpus.map(where, [0]) == [("cpu", [])]
