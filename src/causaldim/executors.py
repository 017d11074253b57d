"""Where the sweep's independent jobs run: in this process (the default), or as Ray tasks
on a cluster (`causaldim[ray]`). A job is a module-level function of one small, plain
argument that reads the shared store by path and writes its SAE folder there; only small
results travel back. Failed Ray tasks are retried, and a retried training job resumes
from its SAE's last checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from tqdm.auto import tqdm

from .errors import UsageError

EXECUTORS = ("local", "ray")
J = TypeVar("J")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[J], R], jobs: Sequence[J], desc: str, progress: bool) -> list[R]:
        """fn over jobs, results in the order of jobs."""
        ...


class LocalExecutor:
    """One job after another in this process."""

    def map(self, fn, jobs, desc: str = "jobs", progress: bool = False) -> list:
        return [fn(job) for job in tqdm(jobs, desc=desc, disable=not progress)]


class RayExecutor:
    """Each job a Ray task with its own CPU (and GPU, when asked for); address=None starts
    or joins a local Ray instance."""

    def __init__(
        self,
        address: str | None = None,
        cpus_per_job: float = 1.0,
        gpus_per_job: float = 0.0,
        max_retries: int = 3,
    ):
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'causaldim[ray]'") from None
        self.ray = ray
        self.address = address
        self.options = {
            "num_cpus": cpus_per_job,
            "num_gpus": gpus_per_job,
            "max_retries": max_retries,
            "retry_exceptions": False,  # a bug fails the run; a dead worker is retried
        }

    def map(self, fn, jobs, desc: str = "jobs", progress: bool = False) -> list:
        if not self.ray.is_initialized():
            self.ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        task = self.ray.remote(**self.options)(fn)
        refs = [task.remote(job) for job in jobs]
        bar = tqdm(total=len(refs), desc=desc, disable=not progress)
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            bar.update(len(done))
        bar.close()
        return self.ray.get(refs)


def executor_for(name: str, address: str | None = None, gpus_per_job: float = 0.0) -> Executor:
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address, gpus_per_job=gpus_per_job)
    raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
