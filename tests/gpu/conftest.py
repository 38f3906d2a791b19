"""The GPU checks as tests (marked `gpu`): each check one test, each result a JSON line the moment it exists.

With CUDA they run at the GPU's sizes; without it, or with EVALKIT_GPU_DRY_RUN=1, the same tests
run on the CPU at small sizes (the dry run: the default suite and CI's image-like venv), with the
modules the GPU image lacks made unimportable, so a GPU run cannot die on an import.

Every result and then every test's outcome (passed; failed with its whole error, message and
traceback; skipped with its reason) is appended to OUT/gpu-checks.jsonl and flushed, OUT being
--gpu-out (default: a temporary directory): a kill or an out-of-memory keeps every earlier row.
--gpu-budget-s: a test that would start later than this after the first one is skipped, reason
"deadline" (the outer `timeout` of the README's command bounds the one running). A CUDA error can
poison the process's context: the failures after one name it (`after_cuda_error`); the checks
that set up process groups or may take minutes run in subprocesses.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.gpu.results import ResultLog

RESULTS = "gpu-checks.jsonl"
ABSENT_ON_THE_IMAGE = ("datasets", "lm_eval", "wonderwords", "vllm", "flash_attn")
# The order a GPU run takes (the budget skips the tail): the model paths first, the minutes-long
# cold 64K mask build and the timings last.
ORDER = ("test_first_contact", "test_vllm_kernels", "test_fsdp", "test_probe", "test_mask_build", "test_attention")
CUDA_ERROR = re.compile(
    r"CUDA error|AcceleratorError|illegal memory access|device-side assert|CUBLAS_STATUS|NCCL error"
)


def dry_run() -> bool:
    """The CPU dry run: no CUDA device, or asked for with EVALKIT_GPU_DRY_RUN=1."""
    return os.environ.get("EVALKIT_GPU_DRY_RUN") == "1" or not torch.cuda.is_available()


@dataclass(frozen=True)
class Sizes:
    """What each check runs at: the GPU's sizes, or the CPU dry run's."""

    attention_lengths: tuple[int, ...]  # FlexAttention (bf16) against fp32 dense
    reference_chunk: int  # queries per chunk of the fp32 reference (bounds its memory)
    heads: tuple[int, int, int]  # query heads, key/value heads, head dim
    train_sets: tuple[str, ...]  # overrides of the GPU recipe
    train_steps: int
    spec_length: int  # every paradigm against float64 attention
    timed_lengths: tuple[int, ...]  # forward+backward timings against full causal
    repeats: int
    vllm_check_seq: int
    vllm_steps: int
    vllm_lengths: tuple[int, int]
    vllm_timed_seq: int
    fsdp_sets: tuple[str, ...]  # overrides of the GPU recipe for the 3 FSDP2 steps
    probe: dict = field(default_factory=dict)  # run_probe options of both kinds
    probe_lengths: str = ""
    mask_length: int = 65536
    mask_limit_s: float = 180.0


SMALL_MODEL = (
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "model.attention=blocked",  # FlexAttention has no CPU backward
)
GPU = Sizes(
    attention_lengths=(16384, 65536),
    reference_chunk=4096,
    heads=(8, 2, 128),
    train_sets=("data.num_retrieval_docs=20000", "checkpoint.every=1000", "checkpoint.final_count=1"),
    train_steps=20,
    spec_length=1024,
    timed_lengths=(16384, 32768, 65536),
    repeats=5,
    vllm_check_seq=8192,
    vllm_steps=20,
    vllm_lengths=(8192, 32768),
    vllm_timed_seq=32768,
    fsdp_sets=("windows_per_step=16", "micro_batch=16", "data.num_retrieval_docs=2000"),
    probe={"n_texts": 20, "seq_len": 4096},
    probe_lengths="256,1024,4096",
    mask_length=65536,
    mask_limit_s=180.0,
)
CPU = Sizes(
    attention_lengths=(128, 256),
    reference_chunk=64,
    heads=(4, 2, 32),
    train_sets=(
        "seq_len=128",
        "windows_per_step=2",
        "micro_batch=2",
        *SMALL_MODEL,
        "data.num_retrieval_docs=200",
        "checkpoint.every=1000",
        "checkpoint.final_count=1",
    ),
    train_steps=2,
    spec_length=64,
    timed_lengths=(128,),
    repeats=1,
    vllm_check_seq=300,
    vllm_steps=2,
    vllm_lengths=(200, 300),
    vllm_timed_seq=600,
    fsdp_sets=("seq_len=128", "windows_per_step=4", "micro_batch=4", *SMALL_MODEL, "data.num_retrieval_docs=200"),
    probe={"n_texts": 2, "seq_len": 48},
    probe_lengths="32,64",
    mask_length=1024,
    mask_limit_s=120.0,
)


class GpuRun:
    """One session's results file, clock and budget, made at the first GPU test."""

    def __init__(self, config: pytest.Config):
        out = config.getoption("gpu_out")
        if out is None:  # the dry run in the suite: its rows are written, then removed
            out = tempfile.mkdtemp(prefix="evalkit-gpu-checks-")
            config.add_cleanup(lambda: shutil.rmtree(out, ignore_errors=True))
        self.out = Path(out)
        self.log = ResultLog(self.out / RESULTS, echo=False)
        self.budget_s = config.getoption("gpu_budget_s")
        self.cuda_error: str | None = None  # the first test whose failure was a CUDA error
        self.device = "cpu" if dry_run() else "cuda"
        self.log.write("machine", **machine(self.device))
        self.started = time.monotonic()  # the budget's clock: from the first check on

    def outcome(self, report: pytest.TestReport) -> None:
        row: dict = {"test": report.nodeid, "outcome": report.outcome, "when": report.when}
        row["duration_s"] = round(report.duration, 2)
        if report.failed:
            row["error"] = report.longreprtext  # whole: the message and the traceback
            if self.cuda_error:
                row["after_cuda_error"] = self.cuda_error  # this failure may only be that one's echo
            elif CUDA_ERROR.search(report.longreprtext):
                self.cuda_error = report.nodeid
        elif report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            row["reason"] = reason.removeprefix("Skipped: ")
        self.log.write("outcome", **row)


_run_key = pytest.StashKey[GpuRun]()


def gpu_run(config: pytest.Config) -> GpuRun:
    if _run_key not in config.stash:
        config.stash[_run_key] = GpuRun(config)
    return config.stash[_run_key]


def machine(device: str) -> dict:
    import platform

    import transformers

    info: dict[str, str | None] = {"device": device, "torch": torch.__version__}
    info |= {"transformers": transformers.__version__, "python": platform.python_version()}
    if device == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    return info


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("gpu_out")
    if out and (Path(out) / RESULTS).exists():
        raise pytest.UsageError(f"{Path(out) / RESULTS} exists: give a new --gpu-out (rows are appended, never mixed)")


def _is_gpu_check(item: pytest.Item) -> bool:
    return item.get_closest_marker("gpu") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GPU checks in ORDER, in the slots they hold (other tests keep their places)."""
    slots = [i for i, item in enumerate(items) if _is_gpu_check(item)]
    rank = {name: n for n, name in enumerate(ORDER)}
    ordered = sorted((items[i] for i in slots), key=lambda item: rank.get(item.path.stem, len(ORDER)))
    for slot, item in zip(slots, ordered):
        items[slot] = item


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not _is_gpu_check(item):
        return
    run = gpu_run(item.config)
    if run.budget_s is not None and time.monotonic() - run.started > run.budget_s:
        pytest.skip("deadline")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    if _is_gpu_check(item) and (report.when == "call" or not report.passed):
        gpu_run(item.config).outcome(report)


@pytest.fixture(scope="session")
def device(request) -> str:
    return gpu_run(request.config).device


@pytest.fixture(scope="session")
def sizes(device) -> Sizes:
    return GPU if device == "cuda" else CPU


@pytest.fixture
def record(request):
    """record(kind, **fields): one result row of this test, appended the moment it exists."""
    log = gpu_run(request.config).log

    def record(kind: str, /, **fields) -> dict:
        return log.write(kind, test=request.node.nodeid, **fields)

    return record


@pytest.fixture
def gpu_out(request) -> Path:
    return gpu_run(request.config).out


@pytest.fixture(autouse=True)
def _as_on_the_image(request, monkeypatch):
    """In the dry run the modules the GPU image lacks cannot be imported (as there)."""
    if _is_gpu_check(request.node) and dry_run():
        for name in ABSENT_ON_THE_IMAGE:
            monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture(scope="session", autouse=True)
def _fail_at_the_recompile_limit():
    """On CUDA, Dynamo's recompile limit is an error, not a silent eager fall-back (which
    materialises FlexAttention's scores): a failed check with a message, not a dead process."""
    if not dry_run():
        fail_on_recompile_limit()


def fail_on_recompile_limit() -> None:
    """Make reaching Dynamo's recompile limit an error instead of a silent fall-back to eager
    (which, for FlexAttention, materialises the scores and runs out of memory at long lengths).
    For the device checks: a failed check with a message beats a dead process with nothing written."""
    config = torch._dynamo.config
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):  # renamed across torch versions
        if hasattr(config, name):
            setattr(config, name, True)
            return


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def empty_cache(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
