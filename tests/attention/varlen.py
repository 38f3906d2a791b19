"""A pure-torch stand-in for flash-attn's varlen kernel: the flash implementation's layout code
(regrouping, the anchor prepended, the scatter back) is tested on the CPU with it."""

import torch
import torch.nn.functional as F


def varlen_reference(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
):
    """Pure-torch emulation of flash_attn_varlen_func's documented semantics.

    q [Nq, Hq, D], k/v [Nk, Hkv, D]; sequence i is q[cu_q[i]:cu_q[i+1]] over k[cu_k[i]:cu_k[i+1]];
    grouped-query heads map query head h to kv head h // (Hq / Hkv); with causal=True and more
    keys than queries the mask is aligned to the bottom-right corner; window_size (left, right),
    -1 for unbounded, keeps key j for query i when i' - left <= j <= i' + right, i' being i
    aligned bottom-right.
    """
    outputs = []
    group = q.shape[1] // k.shape[1]
    for i in range(len(cu_seqlens_q) - 1):
        qs = q[int(cu_seqlens_q[i]) : int(cu_seqlens_q[i + 1])].transpose(0, 1)
        ks = k[int(cu_seqlens_k[i]) : int(cu_seqlens_k[i + 1])].transpose(0, 1).repeat_interleave(group, 0)
        vs = v[int(cu_seqlens_k[i]) : int(cu_seqlens_k[i + 1])].transpose(0, 1).repeat_interleave(group, 0)
        lq, lk = qs.shape[1], ks.shape[1]
        aligned, keys = torch.arange(lk - lq, lk)[:, None], torch.arange(lk)[None, :]
        mask = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            mask &= keys <= aligned
        left, right = window_size
        if left >= 0:
            mask &= keys >= aligned - left
        if right >= 0:
            mask &= keys <= aligned + right
        mask = mask.to(q.device)
        outputs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=softmax_scale).transpose(0, 1))
    return torch.cat(outputs)
