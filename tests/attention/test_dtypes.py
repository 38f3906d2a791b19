"""Under bf16 autocast with fp32 master weights every attention kernel receives one dtype, and the
RoPE precision of training is the one asked for (issue 26, defect 1).

The kernels are spied on where evalkit hands them their inputs (SDPA for dense and blocked, the
FlexAttention function, flash-attn's varlen function), inside an unmodified transformers Llama
whose weights are fp32, as the trainer runs it.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evalkit.attention import kernels, pack, register_hf_attention
from evalkit.attention.hf import hf_name, set_rope_precision
from tests.attention.varlen import varlen_reference

THETA = 10000.0
TINY = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    attention_dropout=0.0,
    rope_parameters={"rope_type": "default", "rope_theta": THETA},
)
DOCS = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14], [15, 16, 17, 18, 19, 20, 21, 22, 23]]


def fp32_llama(impl: str) -> LlamaForCausalLM:
    register_hf_attention()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY))
    model.set_attn_implementation(hf_name(impl))  # evalkit_flash would fail: transformers takes it for its own
    return model  # fp32 weights: the trainer's master weights


def anchor_batch(seq_len: int = 24, position_offset: int = 0):
    packed = pack(DOCS, seq_len, "anchor", bos_id=1, eos_id=2)
    return dict(
        input_ids=packed.input_ids[None],
        position_ids=packed.position_ids[None] + position_offset,
        doc_ids=packed.attention_doc_ids()[None],
    )


class DtypeSpy:
    """Wraps a kernel and records the dtypes of the q, k, v it receives."""

    def __init__(self, kernel):
        self.kernel, self.seen = kernel, []

    def __call__(self, q, k, v, *args, **kwargs):
        self.seen.append((q.dtype, k.dtype, v.dtype))
        return self.kernel(q, k, v, *args, **kwargs)


def fake_flash_varlen(q, k, v, **kwargs):
    """flash_attn_varlen_func's dtype contract (fp16/bf16, one dtype), then its documented semantics."""
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")  # as flash-attn words it
    return varlen_reference(q, k, v, **kwargs)


def spy_on(impl: str, monkeypatch) -> DtypeSpy:
    if impl in ("dense", "blocked"):
        spy = DtypeSpy(torch.nn.functional.scaled_dot_product_attention)
        monkeypatch.setattr(kernels.F, "scaled_dot_product_attention", spy)
    elif impl == "flex":
        spy = DtypeSpy(kernels.flex_attention_function(torch.device("cpu")))
        monkeypatch.setattr(kernels, "flex_attention_function", lambda device, dynamic=False, variant=(): spy)
    else:
        spy = DtypeSpy(fake_flash_varlen)
        monkeypatch.setattr(kernels, "_flash_varlen_func", lambda: spy)
    return spy


@pytest.mark.parametrize("impl", ["dense", "blocked", "flex", "flash"])
def test_every_kernel_sees_the_autocast_dtype_under_bf16_autocast(impl, monkeypatch):
    model = fp32_llama(impl)
    spy = spy_on(impl, monkeypatch)
    batch = anchor_batch()
    grad = impl != "flex"  # FlexAttention has no CPU backward: its forward is what can be checked here
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(**batch).logits
    if grad:
        logits.float().sum().backward()  # the training step: gradients reach the fp32 weights through the cast
        assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
    assert spy.seen and set(spy.seen) == {(torch.bfloat16,) * 3}, spy.seen


def test_one_dtype_without_autocast_is_the_values_dtype(monkeypatch):
    """A bf16 model rotating in fp32 (bf16_full, rope_precision=fp32) hands over q and k in fp32 and
    v in bf16: q·k runs in bf16, as the paper's text has it; an fp32 model stays fp32."""
    spy = spy_on("blocked", monkeypatch)
    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    v = torch.randn(1, 2, 8, 16).bfloat16()
    doc_ids = torch.tensor([[0, 1, 1, 1, 2, 2, 2, 2]])
    out = kernels.document_attention(q, k, v, doc_ids, impl="blocked")
    assert out.dtype == torch.bfloat16 and set(spy.seen) == {(torch.bfloat16,) * 3}
    out = kernels.document_attention(q, k, v.float(), doc_ids, impl="blocked")
    assert out.dtype == torch.float32 and spy.seen[-1] == (torch.float32,) * 3


def test_flash_refuses_fp32_in_one_line_and_runs_bf16_like_blocked(monkeypatch):
    monkeypatch.setattr(kernels, "_flash_varlen_func", lambda: fake_flash_varlen)
    q, k, v = torch.randn(1, 4, 24, 16), torch.randn(1, 2, 24, 16), torch.randn(1, 2, 24, 16)
    doc_ids = anchor_batch()["doc_ids"]
    with pytest.raises(ValueError, match="fp16 or bf16 of one dtype.*dtype=bf16"):
        kernels.document_attention(q, k, v, doc_ids, impl="flash")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        flash = kernels.document_attention(q, k, v, doc_ids, impl="flash")
    blocked = kernels.document_attention(*(t.bfloat16() for t in (q, k, v)), doc_ids, impl="blocked")
    assert flash.dtype == torch.bfloat16
    torch.testing.assert_close(flash.float(), blocked.float(), atol=2e-2, rtol=0)


# ---------------------------------------------------------------------- RoPE precision


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def reference_cos_sin(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's angles by hand, in fp32 as the released code computes them before any cast."""
    inv_freq = 1.0 / THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotated_by_hand(x_HSD: torch.Tensor, positions: torch.Tensor, precision: str) -> torch.Tensor:
    """x (bf16, as the projection under autocast gives it) rotated, then in bf16 for the kernel."""
    cos, sin = reference_cos_sin(positions, x_HSD.shape[-1])
    if precision == "bf16":  # the released code: cos/sin rounded to bf16, every product in bf16
        cos, sin = cos.bfloat16(), sin.bfloat16()
        return x_HSD * cos + rotate_half(x_HSD) * sin
    return (x_HSD.float() * cos + rotate_half(x_HSD.float()) * sin).bfloat16()  # fp32, rounded once


def kernel_inputs_and_projections(precision: str, position_offset: int):
    """The q, k reaching the first layer's kernel and that layer's q/k projections, under autocast."""
    model = fp32_llama("blocked")
    set_rope_precision(model, precision)
    attention = model.model.layers[0].self_attn
    captured = {}
    hooks = [
        attention.q_proj.register_forward_hook(lambda m, a, out: captured.setdefault("q_proj", out)),
        attention.k_proj.register_forward_hook(lambda m, a, out: captured.setdefault("k_proj", out)),
    ]
    blocked = kernels._FUNCTIONS["blocked"]

    def spy(q, k, v, doc_ids, scale=None, **window):
        captured.setdefault("kernel", (q, k))
        return blocked(q, k, v, doc_ids, scale=scale, **window)

    batch = anchor_batch(position_offset=position_offset)
    kernels._FUNCTIONS["blocked"] = spy
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(**batch)
    finally:
        kernels._FUNCTIONS["blocked"] = blocked
        for hook in hooks:
            hook.remove()
    dim = TINY["hidden_size"] // TINY["num_attention_heads"]

    def heads(x):
        return x.view(1, x.shape[1], -1, dim).transpose(1, 2)[0]  # [H, S, D]

    return captured, heads(captured["q_proj"]), heads(captured["k_proj"]), batch["position_ids"][0]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_rope_precision_rotates_as_its_hand_written_reference(precision):
    # Far positions: there bf16's rounding of cos/sin moves the rotation by many ulps.
    captured, q, k, positions = kernel_inputs_and_projections(precision, position_offset=3000)
    q_kernel, k_kernel = captured["kernel"]
    assert q.dtype == k.dtype == torch.bfloat16 and q_kernel.dtype == torch.bfloat16
    torch.testing.assert_close(q_kernel[0], rotated_by_hand(q, positions, precision), atol=0, rtol=0)
    torch.testing.assert_close(k_kernel[0], rotated_by_hand(k, positions, precision), atol=0, rtol=0)
    other = "bf16" if precision == "fp32" else "fp32"
    assert not torch.equal(q_kernel[0], rotated_by_hand(q, positions, other))  # the two settings differ


def test_rope_precision_refuses_unknown_settings_and_models_without_rope():
    with pytest.raises(ValueError, match="fp32, bf16"):
        set_rope_precision(fp32_llama("blocked"), "fp16")
    with pytest.raises(ValueError, match="no rotary embedding"):
        set_rope_precision(torch.nn.Linear(2, 2), "bf16")
