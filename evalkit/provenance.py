"""What made a result: evalkit version and git hash, the machine, the library versions."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import evalkit


@cache
def git_hash() -> str:
    """The evalkit checkout's commit (with '+dirty' for uncommitted changes), or 'unknown'."""
    root = Path(evalkit.__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, str | int]:
    import torch

    info: dict[str, str | int] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def stamp() -> dict[str, object]:
    """Provenance fields every evalkit output records."""
    return {
        "evalkit_version": evalkit.__version__,
        "git_hash": git_hash(),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
    }


def command_line() -> str:
    """The evalkit command this process runs, as the user could retype it."""
    return "evalkit " + shlex.join(sys.argv[1:])


def provenance_lines(info: dict[str, object] | None = None) -> list[str]:
    """Markdown lines naming the machine and the evalkit commit behind a report."""
    info = info or stamp()
    machine_line = ", ".join(f"{k} {v}" for k, v in info["machine"].items())
    return [
        f"Machine: {machine_line}",
        "",
        f"evalkit {info['evalkit_version']} ({info['git_hash']}), {info['created']}",
    ]
