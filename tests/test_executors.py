"""The sweep on Ray gives the in-process numbers, also when a worker dies mid-job."""

from __future__ import annotations

import copy
import json
import os

import pytest
from test_faults import args_for, numbers

from causaldim import cli
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

    def start(env: dict[str, str]):
        os.environ.update(env)  # workers inherit the driver's environment when they start
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

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
