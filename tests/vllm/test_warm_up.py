"""The serving path's FlexAttention compiles: the backend's warm-up covers every shape class the
CUDA lowering distinguishes, and the GPU check's counting of graphs against Dynamo's limit (the
kernels at the GPU check's sizes: tests/gpu/serving.py; its dry run: tests/gpu). No vLLM needed
but for the backend impl's test.
"""

import pytest
import torch

from tests.attention.flex_lowering import CAPABILITIES, FAMILY_LAYOUTS, cuda_flex_configs, cuda_flex_lowering
from tests.gpu import serving
from tests.vllm.conftest import requires_vllm


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
    from evalkit.vllm_plugin.kernels import anchor_document_ids

    _key, _value, key_cache, value_cache, block_table = serving.paged_request(300, dtype, 0, "cpu")
    query = torch.randn(300, serving.HEADS, serving.DIM).to(dtype)
    doc_ids = anchor_document_ids(1, [100, 199])
    serving.prefill_paged(query, key_cache, value_cache, block_table, doc_ids, scale=scale, impl="flex")


def test_recompile_accounting_counts_every_graph_of_the_function_against_its_limit(compiled_on_cpu):
    """The long run's count is all the graphs the serving function holds, earlier ones included
    (Dynamo's limit counts them all), not those compiled during the run; each dtype compiles
    into a function of its own."""
    from tests.gpu.serving import flex_compile_counts

    compiled_on_cpu()
    one_prefill(torch.float32, scale=0.5)  # another dtype: another function, its graph not counted below
    one_prefill(torch.bfloat16, scale=0.5)  # the serving function's first graph (its scale differs from the run's)
    assert sorted(flex_compile_counts().values()) == [1, 1]
    with torch._dynamo.config.patch(recompile_limit=2):  # (monkeypatch's undo breaks torch's config attribute)
        result = serving.long_run(2, (200, 300), device="cpu")  # one more graph (the run's scale), any length
    assert result["graphs"] == 2 and result["limit"] == 2  # a delta would say 1, under the limit
    name, graphs, ok = serving.long_run_row(result, "cpu")
    assert not ok and "2 graphs compiled (limit 2)" in name
    with torch._dynamo.config.patch(recompile_limit=8):
        assert serving.long_run_row(serving.long_run(2, (200, 300), device="cpu"), "cpu")[2]


@pytest.mark.slow
def test_the_long_run_compiles_the_serving_kernel_once_across_layouts_and_lengths(compiled_on_cpu):
    """The serving path's FlexAttention, compiled with dynamic shapes by inductor (as on CUDA),
    across prefills of other lengths, chunks and document layouts, each with a fresh BlockMask:
    one graph, far under Dynamo's limit (past it, FlexAttention runs eager and materialises the
    scores). Measured here on torch's CPU backend; the GPU check counts on CUDA."""
    compiled_on_cpu("inductor")
    result = serving.long_run(5, (300, 700), device="cpu")
    assert result["steps"] == 5 and 1 <= result["graphs"] <= 2 < result["limit"]
    name, graphs, ok = serving.long_run_row(result, "cpu")
    assert ok and f"{result['graphs']} graphs compiled (limit {result['limit']})" in name


def serve_under_vllms_stance(shapes):
    """Prefills of these (queries, keys) under the stance vLLM runs its compiled model with."""
    from evalkit.vllm_plugin.kernels import anchor_attention, anchor_block_mask, anchor_document_ids

    with torch.compiler.set_stance("fail_on_recompile"), torch.inference_mode():  # as vLLM's model runner
        for num_queries, length in shapes:
            doc_ids = anchor_document_ids(1, [n for n in (length // 2, length - 1 - length // 2) if n])
            query = torch.randn(num_queries, serving.HEADS, serving.DIM).bfloat16()
            key, value = (torch.randn(length, serving.KV_HEADS, serving.DIM).bfloat16() for _ in range(2))
            block_mask = anchor_block_mask(doc_ids, num_queries, check_order=False)
            anchor_attention(query, key, value, doc_ids, scale=serving.DIM**-0.5, impl="flex", block_mask=block_mask)


SERVED = [(700, 700), (1, 257), (37, 900), (128, 129), (60, 60), (1, 20), (300, 1000), (128, 128), (1500, 1500), (3, 3)]


def test_without_a_warm_up_the_first_packed_prefill_under_vllms_stance_raises(compiled_on_cpu):
    compiled_on_cpu()
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        serve_under_vllms_stance(SERVED[:1])


def test_the_checks_serving_after_the_warm_up_compile_nothing_under_vllms_stance(compiled_on_cpu, monkeypatch):
    from evalkit.vllm_plugin import kernels

    compiled_on_cpu()
    monkeypatch.setattr(kernels, "_warmed_up", set())
    row = serving.check_warm_serving("cpu")
    assert row["passed"] and 1 <= row["graphs"] < torch._dynamo.config.recompile_limit, row
    monkeypatch.setattr(kernels, "warm_up_shapes", lambda *a, **k: ((384, 384),))  # misses shape classes
    monkeypatch.setattr(kernels, "_warmed_up", set())
    compiled_on_cpu()
    row = serving.check_warm_serving("cpu")
    assert not row["passed"] and "fail_on_recompile" in row["error"]


@requires_vllm  # the backend module imports vLLM's request types
def test_the_impl_compiles_flex_when_built_so_serving_never_compiles(compiled_on_cpu, monkeypatch):
    """The backend impl warms FlexAttention up with its heads, scale and the model's dtype; then
    prefills of any length, chunk and document layout replay graphs that exist."""
    from evalkit.attention.kernels import recompile_limit
    from evalkit.vllm_plugin import kernels
    from evalkit.vllm_plugin.anchor_backend import AnchorAttentionImplMixin
    from tests.gpu.serving import flex_compile_counts

    compiled_on_cpu()
    monkeypatch.setattr(kernels, "_warmed_up", set())

    class StockImpl:  # what vLLM's FlashAttentionImpl sets up, as far as the mixin reads it
        def __init__(self, num_heads, head_size, scale, num_kv_heads):
            self.num_heads, self.head_size, self.scale, self.num_kv_heads = num_heads, head_size, scale, num_kv_heads

    class Impl(AnchorAttentionImplMixin, StockImpl):
        anchor_impl = "flex"

    impl = Impl(serving.HEADS, serving.DIM, serving.DIM**-0.5, serving.KV_HEADS)
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


def cuda_lowering_guards(gm, example_inputs):
    """A Dynamo backend that evaluates the size expressions torch's CUDA lowering of FlexAttention
    evaluates (torch 2.11, torch/_inductor/kernel/flex/flex_decoding.py, _use_flex_decoding:
    Lt(Q, 128) and Gt(Q, 0) on the query count), so the graph is guarded as on CUDA, then runs
    the graph eagerly. The CPU lowering returns before that check: inductor on a CPU cannot see it."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and "flex_attention" in str(node.target):
            query = node.args[0].meta["example_value"]
            bool(query.shape[-2] < 128)  # noqa: PLR2004  (the lowering's constant)
            bool(query.shape[-2] > 0)
    return gm.forward


# Every boundary the guards draw (1, 127/128/129 queries, one or more blocks, Q == L) and sizes
# that equal the layer's heads or head size (duck sizing).
GRID = [
    (q, n)
    for q in (1, 2, 3, 4, 16, 100, 127, 128, 129, 255, 256, 257, 300)
    for n in (2, 3, 16, 100, 127, 128, 129, 255, 256, 257, 384, 385, 700)
    if q <= n
]


def test_served_shapes_replay_after_the_warm_up_under_the_cuda_lowerings_guards(compiled_on_cpu, monkeypatch):
    """With the guards CUDA compiles under (Q <= 127 or Q >= 128), every prefill after the warm-up
    replays a graph: on the old warm-up a prefill of exactly 128 queries compiled under vLLM's
    fail-on-recompile stance and raised. The graphs stay under the serving function's limit."""
    from evalkit.attention.kernels import recompile_limit
    from evalkit.vllm_plugin import kernels
    from tests.gpu.serving import flex_compile_counts

    compiled_on_cpu(cuda_lowering_guards)
    monkeypatch.setattr(kernels, "_warmed_up", set())
    with torch._dynamo.config.patch(recompile_limit=8):  # the default, raised by the warm-up
        kernels.warm_up_anchor_flex(
            serving.HEADS, serving.KV_HEADS, serving.DIM, serving.DIM**-0.5, torch.bfloat16, "cpu"
        )
        serve_under_vllms_stance([*SERVED, *GRID])
        (graphs,) = flex_compile_counts().values()
        assert graphs <= len(kernels.warm_up_shapes()) < recompile_limit() == kernels.SERVING_RECOMPILE_LIMIT


def test_each_shape_class_is_warmed_up_once_by_a_member_clear_of_the_layers_sizes():
    from evalkit.vllm_plugin.kernels import shape_class, warm_up_shapes

    layer = (32, 8, 128)  # Llama-2's heads, key-value heads, head size
    shapes = warm_up_shapes(layer)
    classes = [shape_class(q, n) for q, n in shapes]
    assert len(set(classes)) == len(classes)  # one each
    every_class = {shape_class(q, n) for n in range(2, 1100) for q in range(1, n + 1)}
    assert set(classes) == every_class
    assert (128, 128) in shapes  # the class of exactly 128 queries, the CUDA boundary
    for q, n in shapes:  # no size equal to a head count or the head size, but where a class forces it
        assert q == 128 or not {q, n} & set(layer), (q, n)


def test_every_warm_up_member_has_a_cuda_kernel_for_the_common_model_families_head_layouts():
    """Each member compiles the serving function under torch's CUDA lowering, whose decoding tile
    packs a KV head's query heads (kernels.warm_up_shapes): at 16 over 2 heads (Qwen2.5-3B) the old
    member of 91 queries left none (Inductor's NoValidChoicesError, pytorch PR #185349)."""
    from evalkit.vllm_plugin.kernels import warm_up_shapes

    configs = cuda_flex_configs(128, torch.bfloat16, (9, 0))
    assert cuda_flex_lowering(100, 2, 1, 128, configs) == ("decoding", False)  # pytorch PR #185349's case
    assert cuda_flex_lowering(91, 16, 2, 128, configs) == ("decoding", False)
    assert cuda_flex_lowering(91, 12, 2, 128, configs) == ("flex", True)  # a group of 6: not decoding
    assert cuda_flex_lowering(16, 16, 2, 128, configs) == ("decoding", True)  # 128 rows: one block
    for name, (heads, kv_heads, head_dim) in FAMILY_LAYOUTS.items():
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for capability in CAPABILITIES:
                configs = cuda_flex_configs(head_dim, dtype, capability)
                for q, n in warm_up_shapes((heads, kv_heads, head_dim)):
                    assert cuda_flex_lowering(q, heads, kv_heads, head_dim, configs)[1], (name, q, n, dtype, capability)
