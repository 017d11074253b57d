"""The Hugging Face Hub as a user meets it: switched off, out of reach, gated, or without
the name asked for, each said in one line with what to do, before anything waits on
retries."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from .errors import UsageError


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set."""
    from huggingface_hub import is_offline_mode

    return is_offline_mode()


def is_network_error(exc: BaseException) -> bool:
    """No answer from the hub (offline mode, no connection, a timeout), as opposed to an
    answer that refuses (not found, gated)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, OfflineModeIsEnabled):
        return True
    if isinstance(exc, HfHubHTTPError):  # an answer (an OSError too)
        return False
    transport = []
    for module in ("httpx2", "httpx"):
        try:
            transport.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    if isinstance(exc, (ConnectionError, TimeoutError, *transport)):
        return True
    try:
        from datasets.exceptions import DatasetsError
    except ImportError:
        DatasetsError = ()  # noqa: N806
    return isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, DatasetsError))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's endpoint answers a TCP connection within timeout seconds (the
    clients would otherwise retry for half a minute before saying no)."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


class Unreachable(UsageError):
    """The hub cannot be asked: no network, or HF_HUB_OFFLINE, and nothing cached."""


def unreachable(what: str, name: str, local: str) -> Unreachable:
    """what: 'model', 'dataset', 'SAE release'; local: what to pass instead."""
    why = "HF_HUB_OFFLINE is set" if offline() else "no network"
    return Unreachable(
        f"the Hugging Face Hub cannot be reached ({why}) and {what} {name!r} is not in the HF "
        f"cache: pass {local}, or fill the cache where there is network (hf download {name}) "
        "and run with HF_HUB_OFFLINE=1"
    )


def check_reachable(what: str, name: str, local: str) -> None:
    """Unreachable at once, instead of a client's retries, when the hub cannot be asked."""
    if offline() or not reachable():
        raise unreachable(what, name, local)


def explain(exc: BaseException, what: str, name: str) -> UsageError | None:
    """A hub client's failure as one line naming the fix; None when it is not one of the
    failures a user meets (gated, not found, unknown revision, out of reach)."""
    from huggingface_hub import errors

    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(cause)
    for e in chain:
        if isinstance(e, errors.GatedRepoError) or "gated repo" in str(e).lower():
            return UsageError(
                f"{what} {name!r} is gated: accept its terms on its hub page, then log in "
                "(hf auth login) or set HF_TOKEN"
            )
        if isinstance(e, errors.RevisionNotFoundError):
            return UsageError(f"{what} {name!r} has no such revision; pass another one")
        if isinstance(e, (errors.RepositoryNotFoundError, errors.EntryNotFoundError)):
            return UsageError(
                f"{what} {name!r} is not on the Hugging Face Hub (or is private: log in with "
                "hf auth login or set HF_TOKEN); check the name"
            )
        if isinstance(e, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
            return UsageError(str(unreachable(what, name, "a local copy")))
    return None
