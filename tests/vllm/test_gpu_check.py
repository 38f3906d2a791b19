"""The GPU check script runs end to end on the CPU at small sizes, so a GPU run is not spent on a typo.

Same functions as on CUDA (FlexAttention eager instead of compiled, wall-clock timing);
correctness checks must pass here too. No vLLM needed.
"""

from argparse import Namespace

import pytest
import torch

from evalkit.vllm_plugin import gpu_check
from tests.vllm.conftest import requires_vllm


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
    from evalkit.result_log import ResultLog, read_results

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


def serve_under_vllms_stance(shapes):
    """Prefills of these (queries, keys) under the stance vLLM runs its compiled model with."""
    from evalkit.vllm_plugin.kernels import anchor_attention, anchor_block_mask, anchor_document_ids

    with torch.compiler.set_stance("fail_on_recompile"), torch.inference_mode():  # as vLLM's model runner
        for num_queries, length in shapes:
            doc_ids = anchor_document_ids(1, [length // 2, length - 1 - length // 2])
            query = torch.randn(num_queries, gpu_check.HEADS, gpu_check.DIM).bfloat16()
            key, value = (torch.randn(length, gpu_check.KV_HEADS, gpu_check.DIM).bfloat16() for _ in range(2))
            block_mask = anchor_block_mask(doc_ids, num_queries, check_order=False)
            anchor_attention(query, key, value, doc_ids, scale=gpu_check.DIM**-0.5, impl="flex", block_mask=block_mask)


SERVED = [(700, 700), (1, 257), (37, 900), (128, 129), (60, 60), (1, 20), (300, 1000), (128, 128), (1500, 1500), (3, 3)]


def test_without_a_warm_up_the_first_packed_prefill_under_vllms_stance_raises(compiled_on_cpu):
    compiled_on_cpu()
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        serve_under_vllms_stance(SERVED[:1])


def test_the_checks_serving_after_the_warm_up_compile_nothing_under_vllms_stance(compiled_on_cpu, monkeypatch):
    from evalkit.vllm_plugin import kernels

    compiled_on_cpu()
    monkeypatch.setattr(kernels, "_warmed_up", set())
    name, graphs, ok = gpu_check.check_warm_serving("cpu")
    assert ok and 1 <= graphs < torch._dynamo.config.recompile_limit, name
    monkeypatch.setattr(kernels, "WARM_UP_SHAPES", ((384, 384),))  # a warm-up that misses shape classes
    monkeypatch.setattr(kernels, "_warmed_up", set())
    compiled_on_cpu()
    name, graphs, ok = gpu_check.check_warm_serving("cpu")
    assert not ok and "fail_on_recompile" in name


@requires_vllm  # the backend module imports vLLM's request types
def test_the_impl_compiles_flex_when_built_so_serving_never_compiles(compiled_on_cpu, monkeypatch):
    """The backend impl warms FlexAttention up with its heads, scale and the model's dtype; then
    prefills of any length, chunk and document layout replay graphs that exist."""
    from evalkit.attention.kernels import flex_compile_counts, recompile_limit
    from evalkit.vllm_plugin import kernels
    from evalkit.vllm_plugin.anchor_backend import AnchorAttentionImplMixin

    compiled_on_cpu()
    monkeypatch.setattr(kernels, "_warmed_up", set())

    class StockImpl:  # what vLLM's FlashAttentionImpl sets up, as far as the mixin reads it
        def __init__(self, num_heads, head_size, scale, num_kv_heads):
            self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, num_kv_heads

    class Impl(AnchorAttentionImplMixin, StockImpl):
        anchor_impl = "flex"

    impl = Impl(gpu_check.HEADS, gpu_check.DIM, gpu_check.DIM**-0.5, gpu_check.KV_HEADS)
    with torch.device("cpu"):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # vLLM builds the model under its dtype
        try:
            impl._warm_up_anchor_kernels(torch.device("cpu"))
        finally:
            torch.set_default_dtype(previous)
    serve_under_vllms_stance(SERVED)
    (graphs,) = flex_compile_counts().values()
    assert graphs < recompile_limit()
