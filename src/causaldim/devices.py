"""Where the tensors of a run live and in what precision: the --device and 'auto' dtype
choices resolved against this machine, and how much memory the device has."""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from torch import nn

from .errors import UsageError

DEVICES_HELP = (
    "'auto' (the first CUDA GPU if there is one, else the CPU), 'cpu', 'cuda' or 'cuda:N'"
)


def resolve_device(name: str) -> torch.device:
    """The torch device of a --device value; UsageError naming the fix if this machine
    has no such device."""
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
            "use --device cpu"
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
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_dtype(name: str, device: torch.device) -> str:
    """A compute dtype name, 'auto' resolved: bfloat16 where fast_bf16, else float32."""
    if name != "auto":
        return name
    return "bfloat16" if fast_bf16(device) else "float32"


def memory(device: torch.device) -> tuple[int, int]:
    """(total, free) bytes of the device's memory; for the CPU, physical memory and what
    the kernel reports available."""
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


def describe(device: torch.device) -> str:
    total, free = memory(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
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
