"""Errors that the command line turns into a one-line message and exit code 2."""


class UsageError(ValueError):
    """Bad input, detected before any expensive work; the message names the fix."""


class IntegrityError(RuntimeError):
    """An artifact on disk is damaged (a hash mismatch, truncated, missing): named in one
    line, never silently used; --repair recomputes it."""
