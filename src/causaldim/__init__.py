"""causaldim: how many directions of a transformer layer matter to its output."""

__version__ = "0.1.0"


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
