"""causaldim: how many directions of a transformer layer matter to its output."""

__version__ = "0.1.0"
