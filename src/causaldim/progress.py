"""Progress bars: every wait that can pass 10 s on a 2-core CPU draws one, with an ETA.
None with --quiet (enabled=False), and none where stderr is not a terminal (tqdm's own
rule, so logs and CI stay clean)."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterable, Iterator

from tqdm.auto import tqdm


def bar(iterable: Iterable | None = None, *, desc: str, enabled: bool = True, **kw) -> tqdm:
    """tqdm over iterable (or a manual bar of `total`), shown only where enabled and
    stderr is a terminal."""
    return tqdm(iterable, desc=desc, disable=None if enabled else True, **kw)


@contextlib.contextmanager
def third_party_bars(enabled: bool = True) -> Iterator[None]:
    """transformers' and huggingface_hub's own bars (loading weights, downloads) under
    the same rule as ours: off with --quiet and where stderr is not a terminal."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    show = enabled and sys.stderr.isatty()
    # transformers' GGUF conversion draws a plain tqdm bar that its switch does not reach
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    # (its module's own import of tqdm, patched on purpose: not exported, hence the ignores)
    plain = gguf_utils.tqdm  # pyright: ignore[reportPrivateImportUsage]
    if not show:
        hf_logging.disable_progress_bar()
        disable_progress_bars()
        gguf_utils.tqdm = functools.partial(plain, disable=True)  # pyright: ignore[reportPrivateImportUsage]
    try:
        yield
    finally:
        if not show:
            hf_logging.enable_progress_bar()
            enable_progress_bars()
            gguf_utils.tqdm = plain  # pyright: ignore[reportPrivateImportUsage]
