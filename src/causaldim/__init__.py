"""causaldim: how many directions of a transformer layer matter to its output."""

import os as _os

__version__ = "0.1.0"

# Before torch loads its OpenMP runtime (it reads this once): threads that wait for work
# sleep instead of spinning, so that on a machine other jobs share they give the cores
# back (two runs side by side on 2 cores ran 4x slower each with spinning threads;
# docs/measured.md). A policy the user set is kept.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["measure", "load", "compare", "Results", "load_subspace", "versions"]


def __getattr__(name: str):
    # measure, load, Results and compare are imported on first use: importing causaldim stays
    # cheap (no torch) for the command line's help and for reading results.
    if name in ("measure", "load", "Results"):
        from . import api

        return getattr(api, name)
    if name == "compare":  # compare(runs, out): `causaldim compare` from Python
        from .report.compare import compare

        return compare
    raise AttributeError(f"module 'causaldim' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazily imported names are part of the API too
    return sorted({*globals(), *__all__})


def versions(*names: str) -> dict[str, str]:
    """The versions of the named packages, for provenance ('causaldim' is this one,
    'python' the interpreter)."""
    import importlib
    import platform

    out = {}
    for name in names:
        if name == "causaldim":
            out[name] = __version__
        elif name == "python":
            out[name] = platform.python_version()
        else:
            out[name] = importlib.import_module(name).__version__
    return out


def load_subspace(path):
    """One reading's causal subspace saved by a run (OUT/subspace/L{layer}-{reading}
    .safetensors): eigenvectors [d, d] (columns, descending), eigenvalues (plug-in and
    corrected), and how many directions hold 50/90/99% of the trace."""
    from .measures.subspace import load_subspace as load

    return load(path)
