"""Errors that the command line turns into a one-line message and exit code 2."""


class UsageError(ValueError):
    """Bad input, detected before any expensive work; the message names the fix."""
