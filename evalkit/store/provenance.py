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
from typing import cast

import evalkit


@cache
def git_state() -> tuple[str, tuple[str, ...]]:
    """checkout_state of the evalkit checkout."""
    return checkout_state(Path(evalkit.__file__).resolve().parent.parent)


def checkout_state(root: Path) -> tuple[str, tuple[str, ...]]:
    """(commit, with '+dirty' for uncommitted changes to tracked files, and those files) of the git
    checkout at `root`; ('unknown', ()) outside one. A rename names both its paths."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=5)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        changed = git("diff", "HEAD", "--name-only", "--no-renames", "-z")
    except (OSError, subprocess.SubprocessError):
        return "unknown", ()
    if head.returncode != 0:
        return "unknown", ()
    files = tuple(sorted(name for name in changed.stdout.split("\0") if name))
    return head.stdout.strip() + ("+dirty" if files else ""), files


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


STAMP_KEYS = ("evalkit_version", "git_hash", "created", "machine")  # what every stamp has; older ones no more


def stamp() -> dict[str, object]:
    """Provenance fields every evalkit output records; from a checkout with uncommitted changes, which
    files were changed (their code is not in any commit: the list says what to look at)."""
    commit, dirty = git_state()
    return {
        "evalkit_version": evalkit.__version__,
        "git_hash": commit,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "command": command_line(),
        **({"dirty_files": list(dirty)} if dirty else {}),
    }


def stamp_of(provenance: dict[str, object] | None) -> dict[str, object] | None:
    """The stamp fields of an earlier output's provenance (None when it has no whole stamp)."""
    if not isinstance(provenance, dict) or not all(key in provenance for key in STAMP_KEYS):
        return None
    return {key: provenance[key] for key in (*STAMP_KEYS, "command", "dirty_files") if key in provenance}


def command_line() -> str:
    """The command this process runs, as the user could retype it: `evalkit ...` for the CLI (its
    console script or `python -m evalkit.cli`), `python -m <package> ...`, else the Python program and
    its arguments."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if program.name == "evalkit" or program.parent.name == "cli" and program.parent.parent.name == "evalkit":
        return "evalkit " + shlex.join(sys.argv[1:])
    if program.name == "__main__.py":  # python -m <package>, e.g. the timing programs (perf)
        return f"python -m {program.parent.name} " + shlex.join(sys.argv[1:])
    return "python " + shlex.join(sys.argv)


def provenance_lines(info: dict[str, object] | None = None) -> list[str]:
    info = info or stamp()
    machine = cast(dict, info["machine"])  # a stamp's machine is the dict machine() returns
    machine_line = ", ".join(f"{k} {v}" for k, v in machine.items())
    return [
        f"Machine: {machine_line}",
        "",
        f"evalkit {info['evalkit_version']} ({info['git_hash']}), {info['created']}",
    ]
