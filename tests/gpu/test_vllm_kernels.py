"""The vLLM plugin's kernels on a GPU without vLLM (tests/gpu/serving.py), each check a test:

1. prefills of other lengths and layouts served after the backend's warm-up compile nothing under
   vLLM's fail-on-recompile stance;
2. correctness over a paged KV cache (shuffled blocks of 16, grouped-query heads) against the FP32
   dense reference: bf16 on CUDA (the dtype the packed path serves), bf16 and fp32 in the dry run;
3. the cache-layout learner on vLLM's FlashAttention layout, read back through the prefix workspace
   with no memory allocated by a gather;
4. a long run of packed prefills (8K-32K tokens, each with its own layout, length and chunk): the
   graphs the serving FlexAttention function holds against Dynamo's per-function recompile limit,
   and each step's peak memory against what it must hold;
5. a 32K packed prefill's timing, anchor against causal (a measurement).

1-4 run under inference mode, as vLLM serves: Dynamo keeps separate graphs for inference and
autograd tensors, so they share the serving graphs, and the long run counts them all.
"""

import pytest
import torch

from tests.gpu import serving

pytestmark = pytest.mark.gpu


def test_served_prefills_compile_nothing_after_the_warm_up(device, record):
    with torch.inference_mode():
        row = serving.check_warm_serving(device)
    record("vllm_warm_serving", **row)
    assert row["passed"], row["error"] or row["check"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_paged_prefills_against_the_fp32_reference(dtype, device, sizes, record):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("on CUDA the packed path serves bf16 only (vLLM's FlashAttention refuses fp32)")
    failed = []
    with torch.inference_mode():
        for name, error, ok in serving.check_correctness(sizes.vllm_check_seq, device, dtype):
            record("vllm_kernel_correctness", check=name, max_error=error, passed=ok)
            failed += [] if ok else [(name, error)]
    assert not failed, failed


def test_the_flash_cache_layout_is_read_through_the_workspace(device, record):
    with torch.inference_mode():
        name, error, ok = serving.check_flash_layout(1000 if device == "cuda" else 200, device)
    record("vllm_cache_layout", check=name, max_error=error, passed=ok)
    assert ok, name


def test_a_long_run_stays_under_the_recompile_limit(device, sizes, record):
    with torch.inference_mode():
        result = serving.long_run(sizes.vllm_steps, sizes.vllm_lengths, device)
    name, _, ok = serving.long_run_row(result, device)
    record("vllm_long_run", **result, check=name, passed=ok)
    assert ok, name


def test_prefill_timing_anchor_against_causal(device, sizes, record):
    timings, ideal, documents = serving.time_prefill(sizes.vllm_timed_seq, sizes.repeats, device)
    ms = dict(timings)
    anchor, causal = ms["anchor mode: gather + FlexAttention"], ms["plain causal: gather + FlexAttention"]
    record(
        "vllm_prefill_timing",
        seq=sizes.vllm_timed_seq,
        timings_ms=ms,
        anchor_per_causal=anchor / causal,
        ideal=ideal,
        documents=documents,
    )
    assert all(value > 0 for value in ms.values()) and 0 < ideal < 1 and documents >= 1
