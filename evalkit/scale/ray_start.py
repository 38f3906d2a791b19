"""Starting or joining Ray without losing evalkit's SIGTERM handling."""

from __future__ import annotations

import signal
from typing import Any


def init_ray(**options: Any) -> None:
    """ray.init, then this process's own SIGTERM handler back in place: Ray's core worker installs
    a C-level one that aborts (exit -6), where evalkit's unwinds (engines closed, exit 143)."""
    import ray

    before = signal.getsignal(signal.SIGTERM)
    ray.init(**options)
    if callable(before):
        signal.signal(signal.SIGTERM, before)
