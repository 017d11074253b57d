"""One SAE's training state on disk, so that a killed sweep resumes mid-SAE: weights,
optimiser moments, the dead-feature counters, the generator and the loop's position,
saved every N steps. Each save writes its tensors to a new file, then the JSON that names
that file and its sha256; older tensor files go only after that. A kill at any moment
thus leaves a JSON that points at whole tensors, and a damaged checkpoint is named,
never silently resumed from."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch
from safetensors.torch import load, save

from ..errors import IntegrityError
from ..fileio import atomic_write_bytes, read_sealed_json, write_sealed_json

STATE = "state.json"


class Checkpoint:
    """Training state of the SAE that `request` describes, under folder."""

    def __init__(self, folder: Path, request: dict, every: int, repair: bool = False):
        self.folder, self.request, self.every, self.repair = Path(folder), request, every, repair

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(self, tensors: dict[str, torch.Tensor], state: dict) -> None:
        name = f"state-{state['step']:08d}.safetensors"
        data = save({k: v.detach().contiguous() for k, v in tensors.items()})
        digest = atomic_write_bytes(self.folder / name, data)
        write_sealed_json(
            self.folder / STATE,
            {"request": self.request, "tensors": name, "sha256": digest, **state},
        )
        for old in self.folder.glob("state-*.safetensors"):
            if old.name != name:
                old.unlink()

    def load(self) -> tuple[dict[str, torch.Tensor], dict] | None:
        """(tensors, state) of a checkpoint of this same request, or None. A damaged one
        raises IntegrityError, unless repair is set: then it is removed."""
        meta_path = self.folder / STATE
        if not meta_path.is_file():
            return None
        try:
            state = read_sealed_json(meta_path, "checkpoint")
            if state.get("request") != self.request:
                return None  # another SAE's settings: not this one's to resume
            data = (self.folder / state["tensors"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != state["sha256"]:
                raise ValueError(f"{state['tensors']} does not match the sha256 in {STATE}")
            return load(data), state
        except (OSError, ValueError, KeyError, IntegrityError) as exc:
            if self.repair:
                self.clear()
                return None
            raise IntegrityError(
                f"SAE checkpoint {self.folder} is damaged ({exc}); rerun with --repair to "
                "train that SAE again from the start"
            ) from None

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
