"""Where the tensors of a run live and in what precision: the --device and 'auto' dtype
choices resolved against this machine, and how much memory the device has. A dry run may
plan for a GPU this machine does not have (--plan-for): inside `planning_for`, that GPU's
stated memory and matmul speed stand in for a device's."""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
from torch import nn

from .errors import UsageError


class DeviceProfile(NamedTuple):
    """A GPU planned for, not present: its memory and the speed of a large matmul per
    dtype, as stated (datasheet peaks, dense, scaled to what large matmuls reach)."""

    name: str
    memory_bytes: int
    matmul_flops: dict[str, float]  # dtype -> FLOP/s
    fast_bf16: bool = True


# About 70% of each datasheet's dense peak (bf16 tensor cores; fp32 without TF32, as
# torch's default matmul runs it), the share large matmuls reach in practice.
PROFILES = {
    "h100": DeviceProfile(
        "NVIDIA H100 80GB SXM (planned)",
        80 * 2**30,
        {"bfloat16": 0.7 * 989e12, "float16": 0.7 * 989e12, "float32": 0.7 * 67e12},
    ),
    "h200": DeviceProfile(
        "NVIDIA H200 141GB (planned)",
        141 * 2**30,
        {"bfloat16": 0.7 * 989e12, "float16": 0.7 * 989e12, "float32": 0.7 * 67e12},
    ),
    "a100": DeviceProfile(
        "NVIDIA A100 80GB (planned)",
        80 * 2**30,
        {"bfloat16": 0.7 * 312e12, "float16": 0.7 * 312e12, "float32": 0.7 * 19.5e12},
    ),
}
_planned: ContextVar[DeviceProfile | None] = ContextVar("planned_device", default=None)


@contextmanager
def planning_for(name: str | None):
    """While inside, CUDA devices are the named profile's (None: this machine's own)."""
    if name is None:
        yield None
        return
    if name not in PROFILES:
        raise UsageError(f"--plan-for {name!r}: choose one of {', '.join(PROFILES)}")
    token = _planned.set(PROFILES[name])
    try:
        yield PROFILES[name]
    finally:
        _planned.reset(token)


def planned() -> DeviceProfile | None:
    """The GPU a dry run plans for, if any."""
    return _planned.get()


DEVICES_HELP = (
    "'auto' (the first CUDA GPU if there is one, else the CPU), 'cpu', 'cuda' or 'cuda:N'"
)


def resolve_device(name: str) -> torch.device:
    """The torch device of a --device value; UsageError naming the fix if this machine
    has no such device."""
    if planned() is not None and name in ("auto", "cuda", "cuda:0"):
        return torch.device("cuda", 0)  # the planned GPU
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {name!r} is not a device; choose {DEVICES_HELP}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UsageError(f"--device {name!r}: causaldim runs on {DEVICES_HELP}")
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {name}: this machine has no CUDA GPU (or torch is a CPU build); "
            "use --device cpu, or plan a GPU run from here with --dry-run --plan-for h100"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {name}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    return device if device.index is not None else torch.device("cuda", 0)


def fast_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matmuls are fast here: CUDA GPUs from Ampere (compute capability
    8.0) on. On CPUs causaldim measured bf16 slower than fp32 (AVX2: the backward matmuls
    about 30x), so CPUs count as slow."""
    if device.type != "cuda":
        return False
    if (profile := planned()) is not None:
        return profile.fast_bf16
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_dtype(name: str, device: torch.device) -> str:
    """A compute dtype name, 'auto' resolved: bfloat16 where fast_bf16, else float32."""
    if name != "auto":
        return name
    return "bfloat16" if fast_bf16(device) else "float32"


def memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the device's memory; for the CPU, physical memory and what
    the kernel reports available."""
    if device.type == "cuda" and (profile := planned()) is not None:
        return profile.memory_bytes, profile.memory_bytes
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return total, free
    page = os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * page
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    return total, free


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024  # kB


def reset_peak(device: torch.device) -> int:
    """Restart the count of peak memory; the bytes in use now (on the CPU the process's
    resident set, Linux only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/clear_refs", "w") as f:  # Linux: resets the peak resident set
        f.write("5")
    return _proc_status("VmRSS")


def peak_bytes(device: torch.device) -> int:
    """The peak since reset_peak: torch's allocated bytes on a GPU, the resident set here."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return _proc_status("VmHWM")


def describe(device: torch.device) -> str:
    total, free = memory(device)
    name = "CPU"
    if device.type == "cuda":
        profile = planned()
        name = profile.name if profile else torch.cuda.get_device_name(device)
    return f"{device} ({name}, {total / 2**30:,.0f} GiB, {free / 2**30:,.0f} GiB free)"


@contextmanager
def placed(module: nn.Module, device: torch.device):
    """module on device while inside (one large SAE at a time on a GPU), then back."""
    first = next(module.parameters(), None)
    if first is None:  # nothing to move
        yield module
        return
    home = first.device
    module.to(device)
    try:
        yield module
    finally:
        module.to(home)
