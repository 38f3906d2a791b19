"""The GPU check script runs end to end on the CPU at small sizes, so a GPU run is not spent on a typo.

Same functions as on CUDA (FlexAttention eager instead of compiled, wall-clock timing);
correctness checks must pass here too. No vLLM needed.
"""

from argparse import Namespace

import pytest
import torch

from evalkit.vllm_plugin import gpu_check


def test_gpu_check_functions_pass_at_small_sizes_on_cpu():
    correct = gpu_check.check_correctness(700, device="cpu")
    layout_row = gpu_check.check_flash_layout(200, device="cpu")
    assert all(ok for *_, ok in [*correct, layout_row]), [*correct, layout_row]
    timings, ideal, num_docs = gpu_check.time_prefill(600, repeats=1, device="cpu")
    assert len(timings) == 5 and all(ms > 0 for _, ms in timings) and 0 < ideal < 1 and num_docs >= 1
    long_row = gpu_check.long_run_row(gpu_check.long_run(2, (200, 400), device="cpu"), "cpu")
    text = gpu_check.report(
        correct, layout_row, timings, ideal, num_docs, Namespace(seq=600, repeats=1), "cpu", long_row
    )
    assert "| anchor mode: gather + FlexAttention |" in text and "NO |" not in text and "| long run |" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would run")
def test_gpu_check_refuses_to_run_without_cuda(capsys):
    assert gpu_check.main([]) == 2
    assert "needs one" in capsys.readouterr().err


@pytest.mark.slow
def test_the_long_run_compiles_the_serving_kernel_once_across_layouts_and_lengths(monkeypatch):
    """The serving path's FlexAttention, compiled with dynamic shapes (as on CUDA; compiled here on
    the CPU too), across prefills of other lengths, chunks and document layouts, each with a
    fresh BlockMask: one graph, far under Dynamo's limit (past it, FlexAttention runs eager and
    materialises the scores). Measured here on torch's CPU backend; the GPU check counts on CUDA."""
    from torch.nn.attention.flex_attention import flex_attention

    from evalkit.vllm_plugin import kernels

    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=True)
    monkeypatch.setattr(kernels, "flex_attention_function", lambda device, dynamic=False: compiled)
    result = gpu_check.long_run(5, (300, 700), device="cpu")
    assert result["steps"] == 5 and 1 <= result["graphs"] <= 2 < result["limit"]
    name, graphs, ok = gpu_check.long_run_row(result, "cpu")
    assert ok and f"{result['graphs']} graphs compiled (limit {result['limit']})" in name
