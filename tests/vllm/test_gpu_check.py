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
    text = gpu_check.report(correct, layout_row, timings, ideal, num_docs, Namespace(seq=600, repeats=1), "cpu")
    assert "| anchor mode: gather + FlexAttention |" in text and "NO |" not in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the script would run")
def test_gpu_check_refuses_to_run_without_cuda(capsys):
    assert gpu_check.main([]) == 2
    assert "needs one" in capsys.readouterr().err
