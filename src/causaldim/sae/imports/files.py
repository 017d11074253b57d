"""The files foreign SAEs come in, read safely: JSON, safetensors and npz headers (names,
shapes, dtypes) without the weights, then the weights themselves, each checked finite.
Every failure of the file itself (missing, truncated, pickled, not a float array) is a
one-line UsageError; nothing is unpickled (npz with allow_pickle=False only)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from ...errors import UsageError

Header = dict[str, tuple[str, tuple[int, ...]]]  # name -> (dtype, shape)

# safetensors dtypes an SAE's weights may have; integers, bools and bytes are refused.
_FLOATS = {"F16", "BF16", "F32", "F64"}


def read_json(path: Path) -> dict:
    """A JSON object, or a UsageError naming the file."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"{path} is missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"{path} is not a JSON object")
    return obj


def _damaged(path: Path, exc: Exception) -> UsageError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return UsageError(f"{path} is damaged or truncated ({first})")


def safetensors_header(path: Path) -> Header:
    """The tensors of a safetensors file, from its header; opening it also checks that the
    file is as long as its header says (a truncated file is refused here)."""
    try:
        with safe_open(path, framework="pt") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                s = f.get_slice(name)
                out[name] = (s.get_dtype(), tuple(s.get_shape()))
    except FileNotFoundError:
        raise UsageError(f"{path} is missing") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise _damaged(path, exc) from None
    for name, (dtype, _) in out.items():
        if dtype not in _FLOATS:
            raise UsageError(f"{path}: {name} holds {dtype}, not floating-point weights")
    return out


def _npy_header(f) -> tuple[tuple[int, ...], np.dtype]:
    fmt = np.lib.format
    read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
    version = fmt.read_magic(f)
    if version not in read:
        raise ValueError(f".npy format version {version} is not read")
    shape, _, dtype = read[version](f)
    return shape, dtype


def npz_header(path: Path) -> Header:
    """The arrays of an npz, from each member's .npy header (no array read): an object
    array (which only unpickling could read) or any other non-float array is refused."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if not member.endswith(".npy"):
                    raise UsageError(f"{path}: {member} is not an .npy array")
                with z.open(member) as f:
                    shape, dtype = _npy_header(f)
                name = member[: -len(".npy")]
                if dtype.hasobject:
                    raise UsageError(
                        f"{path}: {name} is an object array, which only unpickling could "
                        "read; causaldim never unpickles (save the weights as float arrays)"
                    )
                if dtype.kind != "f":
                    raise UsageError(f"{path}: {name} holds {dtype}, not floating-point weights")
                out[name] = (dtype.str, tuple(shape))
    except UsageError:
        raise
    except FileNotFoundError:
        raise UsageError(f"{path} is missing") from None
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise _damaged(path, exc) from None
    return out


def header(path: Path) -> Header:
    return npz_header(path) if Path(path).suffix == ".npz" else safetensors_header(path)


def _finite(path: Path, name: str, t: torch.Tensor) -> torch.Tensor:
    if not torch.isfinite(t).all():
        bad = int((~torch.isfinite(t)).sum())
        raise UsageError(f"{path}: {name} holds {bad:,} NaN or infinite values; the SAE is broken")
    return t


def load(path: Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The named tensors (every one where names is None) as stored, each checked finite;
    the header is read first, so that a damaged or unsafe file never reaches the loader."""
    path = Path(path)
    names = list(header(path)) if names is None else names
    out = {}
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                for name in names:
                    out[name] = torch.from_numpy(np.asarray(z[name]))
        else:
            with safe_open(path, framework="pt") as f:
                for name in names:
                    out[name] = f.get_tensor(name)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, SafetensorError) as exc:
        raise _damaged(path, exc) from None
    return {name: _finite(path, name, t) for name, t in out.items()}


def check_finite(path: Path) -> None:
    """Every tensor of the file finite, read one at a time (an SAE's weights never all sit
    in memory twice): the check that runs before any model work."""
    for name in header(path):
        load(path, [name])
