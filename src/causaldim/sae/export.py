"""`causaldim export`: a run's SAEs written in another tool's format, each with the site
it was trained at (found from the store it records), so the other tool hooks the same
stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from ..errors import UsageError
from ..model.load import EMBEDDED
from ..model.sites import equivalents
from ..progress import bar
from .formats import CONFIG, WEIGHTS, export_saelens, load, read_meta, verify

FORMATS = ("saelens",)


class Exported(NamedTuple):
    source: Path  # the causaldim SAE folder
    folder: Path  # what was written
    hook_name: str  # "" when the store it was trained on is not found


def sae_folders(source: Path) -> list[Path]:
    """The causaldim SAE folders a path names: one SAE folder, a run's saes/ folder, or a
    run folder (its saes/), those with weights (--drop-weights deletes some). UsageError
    when it names none."""
    source = Path(source)
    if not source.exists():
        raise UsageError(f"{source} does not exist; pass an SAE folder, OUT/saes or a run folder")
    if _is_sae(source):
        return [source]
    if (source / CONFIG).is_file() and "dropped" in _meta_or_none(source):
        verify(source)  # says its weights were dropped, and how to have them again
    root = source / "saes" if (source / "saes").is_dir() else source
    found = sorted(p for p in root.iterdir() if p.is_dir() and _is_sae(p))
    if not found:
        raise UsageError(
            f"{source} holds no causaldim SAE folder; pass OUT/saes/NAME, OUT/saes or OUT"
        )
    return found


def _meta_or_none(folder: Path) -> dict:
    try:
        return read_meta(folder)
    except UsageError:
        return {}


def _is_sae(folder: Path) -> bool:
    if not ((folder / WEIGHTS).is_file() and (folder / CONFIG).is_file()):
        return False
    try:
        read_meta(folder)
    except UsageError:
        return False  # a sparsify folder has the same file names
    return True


def trained_site(folder: Path) -> tuple[str, str]:
    """(hook name, model name) an SAE was trained on or imported for: the hook its cfg.json
    records, else the layer of the run's store it names (OUT/stores/L{layer}-{digest});
    "" for what neither says."""
    meta = read_meta(folder)
    digest = meta.get("request", {}).get("store", "")
    run = folder.parent.parent  # OUT/saes/NAME -> OUT
    for manifest in sorted(run.glob(f"stores/*-{digest[:12]}/manifest.json")) if digest else []:
        try:
            m = json.loads(manifest.read_text())
            hook = meta.get("hook_name") or equivalents(int(m["layer"]))["saelens"]
            return hook, hub_name(m["model"]["identity"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return meta.get("hook_name", ""), ""


def hub_name(identity: dict) -> str:
    """The model as the hub names it (what SAELens' model_name expects): a hub model's id;
    for the embedded model, the model its GGUF file converts; else the local name."""
    if identity.get("hub_id"):
        return identity["hub_id"]
    embedded = EMBEDDED.get(identity.get("name", ""))
    return embedded.hub_id if embedded else identity.get("name", "")


def export(
    source: Path, dest: Path, fmt: str = "saelens", progress: bool = False
) -> list[Exported]:
    """Write each SAE that source names into dest (dest itself for one SAE, dest/NAME for
    several); refuses, before writing anything, a dest that exists or an unknown format."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not supported; choose one of {', '.join(FORMATS)}")
    folders = sae_folders(source)
    dest = Path(dest)
    if dest.exists():
        raise UsageError(f"{dest} exists; export into a new folder (nothing is overwritten)")
    if dest.resolve().is_relative_to(Path(source).resolve()):
        raise UsageError(f"{dest} lies inside {source}; export into a folder outside the run")
    single = len(folders) == 1 and folders[0] == Path(source)
    out = []
    for folder in bar(folders, desc="export", unit="SAE", enabled=progress):
        hook_name, model_name = trained_site(folder)
        target = dest if single else dest / folder.name
        export_saelens(load(folder), target, hook_name=hook_name, model_name=model_name)
        out.append(Exported(folder, target, hook_name))
    return out
