"""The first-contact command's CPU dry run: every stage at small sizes, in a process where the
modules the lent GPU image lacks cannot be imported (so the GPU run cannot die on an import)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evalkit.attention import Paradigm
from evalkit.bench import first_contact
from evalkit.store.result_log import read_results

ROOT = Path(__file__).resolve().parents[1]
ABSENT_ON_THE_IMAGE = ("datasets", "lm_eval", "wonderwords", "vllm", "flash_attn")
DRY_RUN = f"""
import sys
for name in {ABSENT_ON_THE_IMAGE!r}:
    sys.modules[name] = None  # import raises ImportError, as on the image
from evalkit.bench.first_contact import main
sys.exit(main(["--out", sys.argv[1], "--device", "cpu"]))
"""


def test_the_dry_run_passes_every_stage_without_the_modules_the_image_lacks(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", DRY_RUN, str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_results(out / first_contact.RESULTS)
    by_kind = {}
    for record in records:
        by_kind.setdefault(record["kind"], []).append(record)
    assert [r["stage"] for r in by_kind["stage"]] == ["dtype_probe", "flex_vs_dense", "train_steps", "vllm_kernels"]
    assert all(r["outcome"] == "passed" for r in by_kind["stage"])
    probes = by_kind["dtype_probe"]
    assert {(r["impl"], r["rope_precision"]) for r in probes} == {
        (impl, rope) for impl in ("dense", "blocked", "flex") for rope in ("fp32", "bf16")
    }
    # transformers' own hand-over under autocast (the defect's mechanism), and what every kernel gets
    fp32_rope = [r for r in probes if r["rope_precision"] == "fp32"]
    assert all(r["handed_by_transformers"] == [["float32", "float32", "bfloat16"]] for r in fp32_rope)
    assert all(r["kernel_q_k_v_out"] == [["bfloat16"] * 4] for r in probes)
    # values too: every implementation's bf16 logits within twice blocked's distance from fp32's
    assert all(0 < r["max_abs_logit_error_vs_fp32"] <= 2 * r["blocked_error_vs_fp32"] + 1e-3 for r in probes)
    assert {r["impl"] for r in by_kind["flex_vs_dense"]} == {"blocked", "flex"}
    trained = by_kind["train_steps"]
    assert [(r["paradigm"], r["dtype"]) for r in trained] == [
        ("full", "bf16"),
        ("anchor", "bf16"),
        ("anchor", "bf16_full"),
    ]
    assert all(r["steps"] == 2 and r["tokens_per_s"] > 0 and r["step_s"] > 0 for r in trained)
    assert all(r["memory_estimate_gib"] > 0 and r["data_s"] >= 0 for r in trained)  # the estimate beside the peak
    assert by_kind["flash_attn"] == [{**by_kind["flash_attn"][0], "outcome": "not run: absent", "passed": True}]
    assert len(by_kind["vllm_kernel_correctness"]) == 12 and by_kind["vllm_long_run"][0]["passed"]
    report = (out / first_contact.REPORT).read_text()
    assert "| train_steps | passed |" in report and "Machine:" in report


def test_a_stage_past_the_budget_is_recorded_as_skipped_and_a_failing_one_does_not_stop_the_rest(tmp_path, monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 GiB")

    monkeypatch.setattr(first_contact, "probe_dtypes", out_of_memory)
    monkeypatch.setattr(first_contact, "flex_against_dense", lambda *args: True)
    log = first_contact.ResultLog(tmp_path / "r.jsonl", echo=False)
    outcome = first_contact.run_stages(log, "cpu", first_contact.CPU, tmp_path, budget_s=-1)
    assert outcome["dtype_probe"].startswith("skipped")  # the budget is spent before the first stage
    monkeypatch.setattr(first_contact, "train_steps", lambda *args: True)
    monkeypatch.setattr(first_contact, "vllm_kernels", lambda *args: False)
    outcome = first_contact.run_stages(log, "cpu", first_contact.CPU, tmp_path, budget_s=1e9)
    assert outcome == {
        "dtype_probe": "error: OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 GiB",
        "flex_vs_dense": "passed",
        "train_steps": "passed",
        "vllm_kernels": "FAILED",
    }
    assert [r["outcome"] for r in read_results(tmp_path / "r.jsonl") if r["kind"] == "stage"][-4:] == list(
        outcome.values()
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_or_with_an_earlier_result_file_it_refuses_in_one_line(tmp_path, capsys):
    assert first_contact.main(["--out", str(tmp_path)]) == 2
    assert "--device cpu for the dry run" in capsys.readouterr().err
    (tmp_path / first_contact.RESULTS).write_text("")
    assert first_contact.main(["--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "give a new --out" in capsys.readouterr().err


def test_the_gpu_attention_check_writes_each_result_as_it_is_measured_on_cpu(tmp_path):
    from evalkit.bench import gpu_attention

    log = first_contact.ResultLog(tmp_path / "r.jsonl", echo=False)
    paradigms = (Paradigm.FULL, Paradigm.ANCHOR)  # on a CPU FlexAttention runs eager: two paradigms suffice
    ok, records = gpu_attention.check_correctness(log, device="cpu", length=64, paradigms=paradigms)
    timings = gpu_attention.time_paradigms(log, [128], device="cpu", repeats=1)
    assert ok and len(records) == 2 * 2 * 2 * 2 and len(timings) == 4  # paradigms x seeds x impls x query counts
    assert read_results(tmp_path / "r.jsonl") == [*records, *timings]
    assert "| anchor (seed 0) | flex | 64 |" in "\n".join(gpu_attention.correctness_lines(records))
