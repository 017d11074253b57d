"""Pretrained SAEs by name (--sae-release, --sae-ids): a release resolved to a hub
repository and the files of each id, fetched into the Hugging Face cache, then read like
--sae-paths.

Only safetensors, JSON and npz are fetched; pickles (.pt, .pth, .bin, .ckpt) are refused,
since loading them can run code. Every download goes through `download` and every listing
through `list_folder`, the seams tests replace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .. import hub as hf
from ..errors import UsageError

PICKLES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")

# What the files of one id are, by layout (paths inside the id's folder); the first file
# names where the SAE lies locally: the file itself (npz) or its folder.
LAYOUTS = {
    "gemma-scope": ("params.npz",),
    "saelens": ("cfg.json", "sae_weights.safetensors"),
    "sparsify": ("cfg.json", "sae.safetensors"),
}


@dataclass(frozen=True)
class Release:
    """A release: its hub repository, the layout of its ids, the model it was trained on."""

    repo: str
    layout: str  # a key of LAYOUTS
    model: str | None  # the model (hub id) the SAEs read (None: SAELens' entry names none)
    example: str  # one id, for messages
    note: str = ""  # what to know before reading its SAEs beside this tool's model pass
    folders: dict[str, str] = field(default_factory=dict)  # id -> folder, where they differ


# Releases as SAELens' pretrained_saes.yaml names them (repo ids and id layouts checked
# against it and against SAELens' loaders), and EleutherAI's sparsify repos by repo id (as
# SAELens takes a hub repo). Gemma Scope ids are layer_N/width_W/average_l0_L, N the block
# whose output the SAE reads (SAELens: blocks.N.hook_resid_post).
RELEASES: dict[str, Release] = {
    "gemma-scope-2b-pt-res": Release(
        "google/gemma-scope-2b-pt-res",
        "gemma-scope",
        "google/gemma-2-2b",
        "layer_12/width_16k/average_l0_82",
    ),
    "gemma-scope-9b-pt-res": Release(
        "google/gemma-scope-9b-pt-res",
        "gemma-scope",
        "google/gemma-2-9b",
        "layer_20/width_131k/average_l0_114",
    ),
    # Joseph Bloom's GPT-2 small residual SAEs: ids blocks.N.hook_resid_pre (the output of
    # block N - 1), and blocks.11.hook_resid_post.
    "gpt2-small-res-jb": Release(
        "jbloom/GPT2-Small-SAEs-Reformatted",
        "saelens",
        "openai-community/gpt2",
        "blocks.7.hook_resid_pre",
        note="trained on TransformerLens' gpt2-small with center_writing_weights, whose "
        "residual stream is the Hugging Face one less its per-token mean over d",
    ),
    # EleutherAI's sparsify SAEs: ids are hookpoints, layers.N the output of block N.
    "EleutherAI/sae-llama-3-8b-32x": Release(
        "EleutherAI/sae-llama-3-8b-32x", "sparsify", "meta-llama/Meta-Llama-3-8B", "layers.12"
    ),
    "EleutherAI/sae-pythia-160m-32k": Release(
        "EleutherAI/sae-pythia-160m-32k", "sparsify", "EleutherAI/pythia-160m", "layers.6"
    ),
}


@dataclass(frozen=True)
class Wanted:
    """One SAE to fetch: its release and id, the repo and the files (paths in the repo)."""

    release: str
    id: str
    repo: str
    layout: str
    files: tuple[str, ...]
    model: str | None
    note: str = ""


# ------------------------------------------------------------------------------ the seams


def download(repo: str, filename: str, revision: str | None = None) -> str:
    """One file of a hub repo, from the Hugging Face cache or downloaded into it; its local
    path (under snapshots/<commit>/). Raises huggingface_hub's errors."""
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id=repo, filename=filename, revision=revision)


def list_folder(repo: str, folder: str) -> list[str] | None:
    """The file names directly in a folder of a hub repo: listed by the hub, or, offline or
    out of reach, those of the known layouts found in the local cache (None if none is).
    Raises huggingface_hub's errors (RepositoryNotFoundError, GatedRepoError, ...)."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.hf_api import RepoFile

    try:
        tree = HfApi().list_repo_tree(repo, path_in_repo=folder or None)
        return [PurePosixPath(t.path).name for t in tree if isinstance(t, RepoFile)]
    except Exception as exc:
        if not hf.is_network_error(exc):
            raise
    names = {n for files in LAYOUTS.values() for n in files}
    cached = [
        n for n in sorted(names) if isinstance(try_to_load_from_cache(repo, _join(folder, n)), str)
    ]
    return cached or None


# ---------------------------------------------------------------------------- resolving


def known_releases() -> list[str]:
    return list(RELEASES)


def _sae_lens_release(name: str) -> Release | None:
    """A release of SAELens' pretrained directory, where sae_lens is installed."""
    # sae_lens is optional (no dependency of causaldim): the checker may not find it
    try:
        from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory  # pyright: ignore[reportMissingImports]
    except ImportError:
        try:
            from sae_lens.toolkit.pretrained_saes_directory import (  # pyright: ignore[reportMissingImports]
                get_pretrained_saes_directory,
            )
        except ImportError:
            return None
    lookup = get_pretrained_saes_directory().get(name)
    if lookup is None:
        return None
    conversion = getattr(lookup, "conversion_func", None)
    layouts = {None: "saelens", "sae_lens": "saelens", "gemma_2": "gemma-scope"}
    layout = {**layouts, "sparsify": "sparsify"}.get(conversion)
    if layout is None:
        raise UsageError(
            f"--sae-release {name}: SAELens reads it with its own conversion ({conversion}), "
            "which causaldim does not; download its SAEs, convert them to a SAELens folder "
            "and pass them with --sae-paths"
        )
    folders = dict(getattr(lookup, "saes_map", {}) or {})
    return Release(
        lookup.repo_id,
        layout,
        getattr(lookup, "model", None),
        next(iter(folders), ""),
        folders={k: v for k, v in folders.items() if k != v},
    )


def _unknown_release(name: str) -> UsageError:
    return UsageError(
        f"--sae-release {name}: unknown release; known: {', '.join(known_releases())}, or "
        "any hub repo as 'owner/name' (pip install sae-lens for its whole directory)"
    )


def resolve(release: str, ids: list[str]) -> list[Wanted]:
    """Each id of the release as the files to fetch. A release of the table (or of SAELens'
    directory, where sae_lens is installed), or a hub repo 'owner/name' whose folders the
    ids are (their layout read from the files listed). No download."""
    entry = RELEASES.get(release) or _sae_lens_release(release)
    if entry is None and not _is_repo_id(release):
        raise _unknown_release(release)
    out = []
    for sae_id in ids:
        if PurePosixPath(sae_id).suffix in PICKLES:
            raise _pickle(release, sae_id, [PurePosixPath(sae_id).name])
        if entry is not None:
            folder = entry.folders.get(sae_id, sae_id)
            layout, model, note = entry.layout, entry.model, entry.note
            repo = entry.repo
        else:
            repo, folder, model, note = release, sae_id, None, ""
            layout = _detect(release, repo, sae_id)
        if folder.endswith(".npz"):  # the id names the file itself
            files = (folder,)
        else:
            files = tuple(_join(folder, name) for name in LAYOUTS[layout])
        out.append(Wanted(release, sae_id, repo, layout, files, model, note))
    return out


def _is_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _join(folder: str, name: str) -> str:
    return str(PurePosixPath(folder) / name) if folder else name


def _detect(release: str, repo: str, sae_id: str) -> str:
    """The layout of a folder of a hub repo, from the files in it."""
    if sae_id.endswith(".npz"):
        return "gemma-scope"
    listed = _hub_call(lambda: list_folder(repo, sae_id), release, sae_id, repo, sae_id)
    if listed is None:
        raise _no_network(f"--sae-release {release} --sae-ids {sae_id}", repo, sae_id)
    names = set(listed)
    for layout in ("gemma-scope", "saelens", "sparsify"):
        if set(LAYOUTS[layout]) <= names:
            return layout
    pickled = sorted(n for n in names if PurePosixPath(n).suffix in PICKLES)
    if pickled:
        raise _pickle(release, sae_id, pickled)
    if not names:
        raise UsageError(f"--sae-ids {sae_id}: {repo} has no files in {sae_id}; check the id")
    raise UsageError(
        f"--sae-ids {sae_id}: no SAE causaldim reads in {repo}/{sae_id} (it holds "
        f"{', '.join(sorted(names)[:5])}); expected params.npz (Gemma Scope), cfg.json + "
        "sae_weights.safetensors (SAELens) or cfg.json + sae.safetensors (sparsify)"
    )


def _pickle(release: str, sae_id: str, names: list[str]) -> UsageError:
    return UsageError(
        f"--sae-ids {sae_id} of {release}: {', '.join(names)} is pickled, which causaldim does "
        "not load (unpickling can run code); convert it to safetensors and pass the folder "
        "with --sae-paths"
    )


# ----------------------------------------------------------------------------- fetching


def fetch(wanted: list[Wanted]) -> list[dict]:
    """Every file of every wanted SAE, from the cache or the hub; per SAE its provenance:
    release, id, repo, revision (the commit its files were read at), the local path that
    --sae-paths would take, the layout, the model it belongs to and any note. One-line
    UsageErrors for everything the hub can answer wrong."""
    out = []
    for w in wanted:
        revision, local = None, []
        for name in w.files:
            get = lambda repo=w.repo, n=name, r=revision: download(repo, n, r)  # noqa: E731
            path = _hub_call(get, w.release, w.id, w.repo, name)
            local.append(Path(path))
            revision = revision or _commit_of(Path(path))
        first = local[0]
        out.append(
            {
                "release": w.release,
                "id": w.id,
                "repo": w.repo,
                "revision": revision,
                "path": str(first if first.suffix == ".npz" else first.parent),
                "layout": w.layout,
                "model": w.model,
                **({"note": w.note} if w.note else {}),
            }
        )
    return out


def _commit_of(path: Path) -> str | None:
    """The commit a file of the HF cache was read at: the folder after snapshots/."""
    parts = path.parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots":
            return parts[i + 1]
    return None


def _hub_call(call, release: str, sae_id: str, repo: str, filename: str):
    """call(), its huggingface_hub errors made one-line UsageErrors that name the fix."""
    from huggingface_hub import errors

    what = f"--sae-release {release} --sae-ids {sae_id}"
    try:
        return call()
    except errors.GatedRepoError:
        raise UsageError(
            f"{what}: {repo} is gated; accept its terms on https://huggingface.co/{repo}, "
            "then log in (huggingface-cli login, or set HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise UsageError(
            f"{what}: the hub has no repository {repo} (or it is private: log in with "
            "huggingface-cli login, or set HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise UsageError(f"{what}: {repo} has no such revision") from None
    except errors.LocalEntryNotFoundError:
        raise _no_network(what, repo, filename) from None
    except errors.EntryNotFoundError:
        raise UsageError(
            f"{what}: {repo} has no {filename}; check the id (e.g. {_example(release)})"
        ) from None
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 401:
            raise UsageError(
                f"{what}: the hub refused the token for {repo} (401); log in again "
                "(huggingface-cli login, or set HF_TOKEN)"
            ) from None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"{what}: the hub answered: {first}") from None
    except Exception as exc:
        if hf.is_network_error(exc):
            raise _no_network(what, repo, filename) from None
        raise


def _no_network(what: str, repo: str, filename: str) -> UsageError:
    if hf.offline():
        return UsageError(
            f"{what}: {repo}/{filename} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 "
            "forbids downloading it; fetch it once online, or use local files with --sae-paths"
        )
    return UsageError(
        f"{what}: the hub cannot be reached to fetch {repo}/{filename} (and it is not in the "
        "cache); use local files with --sae-paths, or HF_HUB_OFFLINE=1 with a filled cache"
    )


def _example(release: str) -> str:
    entry = RELEASES.get(release)
    return entry.example if entry else "a folder of the repo holding the SAE's files"
