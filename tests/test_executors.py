"""The sweep on Ray gives the in-process numbers, also when a worker dies mid-job."""

from __future__ import annotations

import copy
import json
import os

import pytest
from test_faults import args_for, numbers

from causaldim import cli
from causaldim.executors import RayExecutor
from causaldim.faults import ENV, ONCE

ray = pytest.importorskip("ray")

SWEEP = ["--widths", "16", "32", "64"]  # three independent training jobs


def same_numbers(a: dict, b: dict) -> bool:
    """Equal numbers; where the jobs ran is no number."""
    a, b = copy.deepcopy(a), copy.deepcopy(b)
    for r in (a, b):
        r["config"]["sweep"].pop("executor")
        r["config"]["sweep"].pop("ray_address")
    return numbers(a) == numbers(b)


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
def test_the_ray_executor_gives_the_in_process_numbers(
    local_run, cluster, tmp_path, tiny_model, text_corpus
):
    cluster({})
    out = tmp_path / "run"
    args = [*args_for(tiny_model("llama"), text_corpus, out), *SWEEP, "--executor", "ray"]
    assert cli.main(args) == 0
    assert same_numbers(json.loads((out / "results.json").read_text()), local_run)


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
    assert same_numbers(json.loads((out / "results.json").read_text()), local_run)


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
