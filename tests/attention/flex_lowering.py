"""torch's CUDA lowering of FlexAttention evaluated on the CPU: which kernel a call compiles to and
whether any of its configs is left (torch 2.13's rules, read from torch/_inductor/kernel/flex/)."""

# Heads, key-value heads and head size of common model families (their config.json files).
FAMILY_LAYOUTS = {
    "Llama-3-8B": (32, 8, 128),
    "Llama-3-70B": (64, 8, 128),
    "Llama-3.2-1B": (32, 8, 64),
    "Llama-3.2-3B": (24, 8, 128),
    "Mistral-7B": (32, 8, 128),
    "Qwen2.5-0.5B": (14, 2, 64),
    "Qwen2.5-1.5B": (12, 2, 128),
    "Qwen2.5-3B": (16, 2, 128),
    "Qwen2.5-7B": (28, 4, 128),
    "Qwen2.5-14B": (40, 8, 128),
    "Qwen2.5-32B": (40, 8, 128),
    "Qwen2.5-72B": (64, 8, 128),
    "Gemma-3-1B": (4, 1, 256),
    "Gemma-3-4B": (8, 4, 256),
    "Gemma-3-12B": (16, 8, 256),
    "Gemma-3-27B": (32, 16, 128),
}
CAPABILITIES = [(8, 0), (8, 6), (9, 0), (10, 0), (11, 0), (12, 0)]  # those torch's CUDA config tables tell apart


def cuda_flex_configs(head_dim, dtype, capability):
    """(forward, decoding) configs of torch's CUDA tables for a GPU generation (torch/_inductor/
    template_heuristics/triton.py, CUDAConfigHeuristic), read without a GPU."""
    from unittest import mock

    from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic

    with mock.patch("torch.cuda.get_device_capability", return_value=capability):
        heuristic = CUDAConfigHeuristic()
        return heuristic.get_flex_attn_fwd_configs(head_dim, dtype), heuristic.get_flex_decode_configs(head_dim, dtype)


def cuda_flex_lowering(num_queries, num_heads, num_kv_heads, head_dim, configs, kernel_options=None, sparse_block=128):
    """(kernel, whether a config is left): torch 2.13's CUDA lowering (torch/_inductor/kernel/flex/)
    of evalkit's FlexAttention call (a static batch, a one-head BlockMask of 128-blocks) compiled at
    Q queries with these kernel options."""
    forward, decoding = configs
    group = num_heads // num_kv_heads
    if head_dim < 16:  # flex_attention.py, flex_attention: NotImplementedError
        return "flex", False
    # flex_decoding.py, _use_flex_decoding: Q < 128, a power-of-two group (static batch and heads), not forced
    force_flex = (kernel_options or {}).get("FORCE_USE_FLEX_ATTENTION", False)
    if num_queries < 128 and group & (group - 1) == 0 and not force_flex:
        # create_flex_decoding_kernel: a KV head's group packed into BLOCK_M, sized from Q (its hint);
        # a config is dropped unless BLOCK_M and its BLOCK_N (capped at the block) divide the blocks
        block_m = max(1 << (num_queries * group - 1).bit_length(), 16)
        fits = [sparse_block % block_m == 0 and sparse_block % min(c.block_n, sparse_block) == 0 for c in decoding]
        return "decoding", any(fits)
    # flex_attention.py, flex_attention: a config is dropped unless BLOCK_M and BLOCK_N divide the blocks
    return "flex", any(sparse_block % c.block_m == 0 and sparse_block % c.block_n == 0 for c in forward)
