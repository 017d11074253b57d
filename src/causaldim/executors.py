"""Where the sweep's independent jobs run: in this process (the default), or as Ray tasks
on a cluster (`causaldim[ray]`). A job is a module-level function of one small, plain
argument that reads the shared store by path and writes its SAE folder there; only small
results travel back. Failed Ray tasks are retried, and a retried training job resumes
from its SAE's last checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from .errors import UsageError
from .progress import bar

EXECUTORS = ("local", "ray")
J = TypeVar("J")
R = TypeVar("R")


class Executor(Protocol):
    device: str  # where each job puts its tensors: a torch device, or 'auto' on a worker

    def map(
        self, fn: Callable[[J, str], R], jobs: Sequence[J], desc: str, progress: bool
    ) -> list[R]:
        """fn(job, device) over jobs, results in the order of jobs."""
        ...


class LocalExecutor:
    """One job after another in this process, on one device."""

    def __init__(self, device: str = "cpu"):
        self.device = device

    def map(self, fn, jobs, desc: str = "jobs", progress: bool = False) -> list:
        return [fn(job, self.device) for job in bar(jobs, desc=desc, enabled=progress)]


class RayExecutor:
    """Each job a Ray task with one CPU, and one GPU where the cluster has GPUs (unless
    device is 'cpu'); the jobs then run on the GPU Ray gives them. address=None starts or
    joins a local Ray instance."""

    def __init__(
        self,
        address: str | None = None,
        device: str = "auto",
        cpus_per_job: float = 1.0,
        max_retries: int = 3,
    ):
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'causaldim[ray]'") from None
        self.ray = ray
        self.address = address
        self.device = "cpu" if device == "cpu" else "auto"  # a worker sees its GPU as cuda:0
        self.options = {
            "num_cpus": cpus_per_job,
            "max_retries": max_retries,
            "retry_exceptions": False,  # a bug fails the run; a dead worker is retried
        }

    def gpus_per_job(self) -> float:
        if self.device == "cpu":
            return 0.0
        return 1.0 if self.ray.cluster_resources().get("GPU", 0) >= 1 else 0.0

    def map(self, fn, jobs, desc: str = "jobs", progress: bool = False) -> list:
        if not self.ray.is_initialized():
            self.ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        task = self.ray.remote(**self.options, num_gpus=self.gpus_per_job())(fn)
        refs = [task.remote(job, self.device) for job in jobs]
        shown = bar(desc=desc, total=len(refs), enabled=progress)
        pending = list(refs)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            shown.update(len(done))
        shown.close()
        return self.ray.get(refs)


def executor_for(name: str, address: str | None = None, device: str = "cpu") -> Executor:
    """The executor of --executor name whose jobs run on device (a resolved --device;
    under Ray, on the GPU each task is given where the cluster has GPUs)."""
    if name == "local":
        return LocalExecutor(device)
    if name == "ray":
        return RayExecutor(address, device)
    raise UsageError(f"--executor must be one of {', '.join(EXECUTORS)}, got {name!r}")
