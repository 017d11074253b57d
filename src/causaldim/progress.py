"""Progress bars: every wait that can pass 10 s on a 2-core CPU draws one, with an ETA.
None with --quiet (enabled=False), and none where stderr is not a terminal (tqdm's own
rule, so logs and CI stay clean)."""

from __future__ import annotations

from collections.abc import Iterable

from tqdm.auto import tqdm


def bar(iterable: Iterable | None = None, *, desc: str, enabled: bool = True, **kw) -> tqdm:
    """tqdm over iterable (or a manual bar of `total`), shown only where enabled and
    stderr is a terminal."""
    return tqdm(iterable, desc=desc, disable=None if enabled else True, **kw)
