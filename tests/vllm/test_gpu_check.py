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


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """FlexAttention compiled on this CPU as on CUDA, from a clean Dynamo cache (backend: the
    parameter's, default Dynamo alone: the graphs it holds and counts are the same whatever
    compiles them, and it takes seconds instead of a minute)."""
    from evalkit.attention import kernels

    def setup(backend: str = "eager"):
        torch._dynamo.reset()
        monkeypatch.setattr(kernels, "COMPILE_DEVICES", {"cuda", "cpu"})
        monkeypatch.setattr(kernels, "COMPILE_BACKEND", backend)
        monkeypatch.setattr(kernels, "_compiled_flex", {})

    yield setup
    torch._dynamo.reset()


def one_prefill(dtype, scale):
    from evalkit.vllm_plugin.kernels import anchor_document_ids, anchor_prefill_paged

    _key, _value, key_cache, value_cache, block_table = gpu_check.paged_request(300, dtype, 0, "cpu")
    query = torch.randn(300, gpu_check.HEADS, gpu_check.DIM).to(dtype)
    doc_ids = anchor_document_ids(1, [100, 199])
    anchor_prefill_paged(query, key_cache, value_cache, block_table, doc_ids, scale=scale, impl="flex")


def test_recompile_accounting_counts_every_graph_of_the_function_against_its_limit(compiled_on_cpu):
    """The long run's count is all the graphs the serving function holds, earlier ones included
    (Dynamo's limit counts them all), not those compiled during the run; each dtype compiles
    into a function of its own."""
    from evalkit.attention.kernels import flex_compile_counts

    compiled_on_cpu()
    one_prefill(torch.float32, scale=0.5)  # another dtype: another function, its graph not counted below
    one_prefill(torch.bfloat16, scale=0.5)  # the serving function's first graph (its scale differs from the run's)
    assert sorted(flex_compile_counts().values()) == [1, 1]
    with torch._dynamo.config.patch(recompile_limit=2):  # (monkeypatch's undo breaks torch's config attribute)
        result = gpu_check.long_run(2, (200, 300), device="cpu")  # one more graph (the run's scale), any length
    assert result["graphs"] == 2 and result["limit"] == 2  # a delta would say 1, under the limit
    name, graphs, ok = gpu_check.long_run_row(result, "cpu")
    assert not ok and "2 graphs compiled (limit 2)" in name
    with torch._dynamo.config.patch(recompile_limit=8):
        assert gpu_check.long_run_row(gpu_check.long_run(2, (200, 300), device="cpu"), "cpu")[2]


def test_each_result_is_in_the_results_file_before_a_later_check_fails(tmp_path, monkeypatch):
    from evalkit.bench.result_log import ResultLog, read_results

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(gpu_check, "long_run", out_of_memory)
    log = ResultLog(tmp_path / "results.jsonl", echo=False)
    with pytest.raises(torch.OutOfMemoryError):
        gpu_check.run_checks(log, 300, 2, (200, 300), "cpu")
    records = read_results(tmp_path / "results.jsonl")
    kinds = [r["kind"] for r in records]
    assert kinds.count("vllm_kernel_correctness") == 12 and kinds[-1] == "vllm_cache_layout"
    assert all(r["passed"] for r in records)


@pytest.mark.slow
def test_the_long_run_compiles_the_serving_kernel_once_across_layouts_and_lengths(compiled_on_cpu):
    """The serving path's FlexAttention, compiled with dynamic shapes by inductor (as on CUDA),
    across prefills of other lengths, chunks and document layouts, each with a fresh BlockMask:
    one graph, far under Dynamo's limit (past it, FlexAttention runs eager and materialises the
    scores). Measured here on torch's CPU backend; the GPU check counts on CUDA."""
    compiled_on_cpu("inductor")
    result = gpu_check.long_run(5, (300, 700), device="cpu")
    assert result["steps"] == 5 and 1 <= result["graphs"] <= 2 < result["limit"]
    name, graphs, ok = gpu_check.long_run_row(result, "cpu")
    assert ok and f"{result['graphs']} graphs compiled (limit {result['limit']})" in name
