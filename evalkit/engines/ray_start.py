"""Starting or joining Ray without losing evalkit's SIGTERM handling."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_TERMINATED: list[int] = []  # the signals this process received while Ray waited


def init_ray(**options: Any) -> None:
    """ray.init, then this process's own SIGTERM handler back in place: Ray's core worker installs
    a C-level one that aborts (exit -6), where evalkit's unwinds (engines closed, exit 143)."""
    import ray

    before = signal.getsignal(signal.SIGTERM)
    ray.init(**options)
    if callable(before):

        def on_sigterm(signum, frame) -> None:
            _TERMINATED.append(signum)
            before(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)


@contextmanager
def exit_status_kept() -> Iterator[None]:
    """Around ray.wait/ray.get: Ray turns the SystemExit a signal handler raises inside them into
    SystemExit(1); a stop by SIGTERM leaves with 128 + SIGTERM, as without Ray."""
    try:
        yield
    except SystemExit:
        if _TERMINATED:
            raise SystemExit(128 + _TERMINATED[-1]) from None
        raise
