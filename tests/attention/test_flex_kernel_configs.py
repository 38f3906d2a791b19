"""Every FlexAttention call evalkit makes compiles under torch's CUDA lowering (evaluated on the CPU:
tests/attention/flex_lowering.py): below 128 queries its decoding kernel packs a key-value head's
query heads into one tile, which must fit the BlockMask's 128-query block."""

import torch

from evalkit.attention import kernels
from tests.attention.flex_lowering import CAPABILITIES, FAMILY_LAYOUTS, cuda_flex_configs, cuda_flex_lowering


def passed_kernel_options(monkeypatch, num_heads, num_kv_heads, head_dim, num_queries, dynamic):
    """The kernel options run_flex hands the compiled FlexAttention function for these shapes."""
    seen = {}

    def compiled(q, k, v, **options):
        seen.update(options)
        return q

    monkeypatch.setattr(kernels, "COMPILE_DEVICES", {"cuda", "cpu"})
    monkeypatch.setattr(kernels, "flex_attention_function", lambda device, dynamic=False, variant=(): compiled)
    q = torch.zeros(()).expand(1, num_heads, num_queries, head_dim)  # no memory
    kv = torch.zeros(()).expand(1, num_kv_heads, num_queries, head_dim)
    kernels.run_flex(q, kv, kv, None, scale=None, mask_kind="documents", dynamic=dynamic)
    return seen.get("kernel_options")  # None: none passed


def test_every_flex_call_compiles_to_a_cuda_kernel_for_the_common_model_families_head_layouts(monkeypatch):
    """A static graph (training windows, the hf engine's packed prefills) compiles at its own Q; a
    dynamic one (vLLM's) at the first Q of its class, Dynamo's guards (Q == 1, Q < 128), and replays
    it for the rest of the class: its options must be the class's, valid at any first Q. Without
    options, 17 to 127 queries over Qwen2.5-3B's 16 query and 2 key-value heads left no config."""
    configs = cuda_flex_configs(128, torch.bfloat16, (9, 0))
    assert cuda_flex_lowering(16, 16, 2, 128, configs) == ("decoding", True)  # 16 x 8 rows: one block
    assert cuda_flex_lowering(17, 16, 2, 128, configs) == ("decoding", False)  # 136 rows: a 256-row tile
    assert cuda_flex_lowering(17, 16, 2, 128, configs, {"FORCE_USE_FLEX_ATTENTION": True}) == ("flex", True)
    queries = range(1, 301)
    tables = {}  # configs by head size, dtype and GPU generation
    for name, (heads, kv_heads, head_dim) in FAMILY_LAYOUTS.items():
        for dynamic in (False, True):
            options = {q: passed_kernel_options(monkeypatch, heads, kv_heads, head_dim, q, dynamic) for q in queries}
            if dynamic:
                for guards in {(q == 1, q < 128) for q in queries}:
                    in_class = [options[q] for q in queries if (q == 1, q < 128) == guards]
                    assert all(o == in_class[0] for o in in_class), (name, guards)
            for dtype in (torch.bfloat16, torch.float16, torch.float32):
                for capability in CAPABILITIES:
                    if (head_dim, dtype, capability) not in tables:
                        tables[head_dim, dtype, capability] = cuda_flex_configs(head_dim, dtype, capability)
                    configs = tables[head_dim, dtype, capability]
                    for q in queries:
                        lowering = cuda_flex_lowering(q, heads, kv_heads, head_dim, configs, options[q])
                        assert lowering[1], (name, q, dynamic, dtype, capability)
