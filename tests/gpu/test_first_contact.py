"""First contact with a GPU: the model paths the CPU cannot settle, each check a test.

1. dtype probe: a small Llama with fp32 master weights under bf16 autocast, through evalkit's
   transformers path with each implementation (dense, blocked, flex; flash with flash-attn, else a
   "not run: absent" row), forward and backward, under both RoPE precisions: the dtypes the
   attention function is handed (transformers' own: q and k fp32, v bf16, expected) and those each
   kernel receives (bf16 only), and the bf16 logits against the fp32 model's.
2. FlexAttention (bf16, compiled) forward and backward against an fp32 dense reference at 16K and
   64K, anchor documents, grouped-query heads; the blocked implementation in bf16 beside it, the
   error bf16 alone makes. flex passes within 2x blocked's error (+1e-3).
3. 20 training steps of the GPU recipe (tiny-gpu, 64 windows of 1K) under full and anchor, and
   anchor in the paper recipes' regime: tokens/s, step and data time, peak memory beside the
   memory model's estimate, loss, and the graphs each compiled FlexAttention function holds.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest
import torch

from tests.gpu.conftest import empty_cache, sync
from tests.gpu.results import read_results

pytestmark = pytest.mark.gpu


# ----------------------------------------------------------------------------- 1. dtype probe


def _probe_model(impl: str, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from evalkit.attention import register_hf_attention
    from evalkit.attention.hf import hf_name

    register_hf_attention()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attention_dropout=0.0,
    )
    # (ignore: transformers wraps PreTrainedModel.to with functools.wraps, which mypy types as unbound)
    model = LlamaForCausalLM(config).to(device)  # type: ignore[arg-type]  # fp32: the trainer's master weights
    model.set_attn_implementation(hf_name(impl))
    return model


@contextmanager
def _dtype_spies(impl: str):
    """Record the dtypes handed to document_attention by transformers, and those its kernel gets
    (q, k, v) and gives back (its output)."""
    from evalkit.attention import hf, kernels

    handed, received = [], []
    original_entry, original_kernel = hf.document_attention, kernels._FUNCTIONS[impl]

    def entry(q, k, v, *args, **kwargs):
        handed.append(tuple(str(t.dtype).removeprefix("torch.") for t in (q, k, v)))
        return original_entry(q, k, v, *args, **kwargs)

    def kernel(q, k, v, *args, **kwargs):
        out = original_kernel(q, k, v, *args, **kwargs)
        # and the output's: a kernel that autocast ran in fp32 despite bf16 inputs would show it here
        received.append(tuple(str(t.dtype).removeprefix("torch.") for t in (q, k, v, out)))
        return out

    hf.document_attention, kernels._FUNCTIONS[impl] = entry, kernel
    try:
        yield handed, received
    finally:
        hf.document_attention, kernels._FUNCTIONS[impl] = original_entry, original_kernel


def _autocast_error(model, rope: str, batch: dict, reference: torch.Tensor) -> float:
    """The largest logit difference of `model` under bf16 autocast (rotating in `rope`) from `reference`."""
    from evalkit.attention.hf import set_rope_precision

    set_rope_precision(model, rope)
    with torch.no_grad(), torch.autocast(str(reference.device.type), dtype=torch.bfloat16):
        logits = model(**batch, use_cache=False).logits
    return float((logits.float() - reference).abs().max())


@pytest.fixture(scope="module")
def probe(device):
    """The packed batch, the fp32 model's logits, and the blocked implementation's bf16 distance
    from them per RoPE precision (the CPU-tested implementation: the yardstick of the others)."""
    from evalkit.attention import pack

    packed = pack([[5] * 300, [6] * 200, [7] * 400], 512, "anchor", bos_id=1, eos_id=2)
    batch = {
        "input_ids": packed.input_ids[None].to(device),
        "position_ids": packed.position_ids[None].to(device),
        "doc_ids": packed.doc_ids[None].to(device),
    }
    with torch.no_grad():
        reference = _probe_model("dense", device)(**batch, use_cache=False).logits.float()
    blocked = {
        rope: _autocast_error(_probe_model("blocked", device), rope, batch, reference) for rope in ("fp32", "bf16")
    }
    return batch, reference, blocked


@pytest.mark.parametrize("rope", ["fp32", "bf16"])
@pytest.mark.parametrize("impl", ["dense", "blocked", "flex", "flash"])
def test_dtype_probe(impl, rope, device, probe, record):
    """Each kernel gets (and gives) bf16 only, and its bf16 logits are within twice the blocked
    implementation's distance from the fp32 model's: values, not only dtypes."""
    from evalkit.attention import available_implementations
    from evalkit.attention.hf import set_rope_precision

    if impl not in available_implementations(device) and impl != "flex":  # flex on a CPU: forward only
        record("flash_attn", rope_precision=rope, outcome="not run: absent", passed=True)
        pytest.skip(f"{impl}: not available here (flash-attn absent)")
    batch, reference, blocked = probe
    backward = not (impl == "flex" and device == "cpu")
    model = _probe_model(impl, device)
    set_rope_precision(model, rope)
    with _dtype_spies(impl) as (handed, received):
        with torch.set_grad_enabled(backward), torch.autocast(device, dtype=torch.bfloat16):
            logits = model(**batch, use_cache=False).logits
        error = float((logits.detach().float() - reference).abs().max())
        if backward:
            logits.float().logsumexp(-1).mean().backward()
    bound = 2 * blocked[rope] + 1e-3
    passed = bool(received) and set(received) == {("bfloat16",) * 4} and error <= bound
    record(
        "dtype_probe",
        impl=impl,
        rope_precision=rope,
        backward=backward,
        handed_by_transformers=sorted(set(handed)),
        kernel_q_k_v_out=sorted(set(received)),
        max_abs_logit_error_vs_fp32=error,
        blocked_error_vs_fp32=blocked[rope],
        passed=passed,
    )
    if rope == "fp32":  # transformers' own hand-over under autocast: rotated q and k stay fp32
        assert set(handed) == {("float32", "float32", "bfloat16")}, handed
    assert set(received) == {("bfloat16",) * 4}, received
    assert 0 < error <= bound


# ----------------------------------------------------------------------------- 2. flex vs dense


def _reference_chunked(q, k, v, doc_ids, chunk: int, gout):
    """fp32 dense attention with the reference mask, one chunk of queries at a time (its memory is
    chunk x S, never S x S), and the gradients of <out, gout> with respect to q, k, v."""
    import torch.nn.functional as F

    from evalkit.attention import document_mask

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    outs = []
    for start in range(0, q.shape[2], chunk):
        stop = min(start + chunk, q.shape[2])
        # Rows start..stop-1 are the last queries of the first `stop` positions; later keys are causally masked.
        mask = document_mask(doc_ids[..., :stop], stop, stop - start)
        out = F.scaled_dot_product_attention(
            q32[:, :, start:stop],
            k32[:, :, :stop],
            v32[:, :, :stop],
            attn_mask=mask[:, None],
            enable_gqa=q.shape[1] != k.shape[1],
        )
        (out * gout[:, :, start:stop].float()).sum().backward()
        outs.append(out.detach())
    return torch.cat(outs, dim=2), (q32.grad, k32.grad, v32.grad)


def _errors(out, grads, ref_out, ref_grads) -> tuple[float, float]:
    out_error = float((out.detach().float() - ref_out).abs().max())
    grad_error = max(float((g.detach().float() - r).norm() / r.norm()) for g, r in zip(grads, ref_grads))
    return out_error, grad_error


@pytest.mark.parametrize("which", [0, 1], ids=["shorter", "longer"])
def test_flex_against_dense(which, device, sizes, record):
    """FlexAttention in bf16 (compiled on CUDA) within twice the blocked implementation's bf16
    error from fp32 dense attention, forward and (on CUDA) backward."""
    from evalkit.attention import document_attention, pack
    from tests.gpu.serving import document_lengths, flex_compile_counts

    length = sizes.attention_lengths[which]
    hq, hkv, dim = sizes.heads
    docs = [[5] * n for n in document_lengths(length, max(16, length // 16), seed=length)]
    doc_ids = pack(docs, length, "anchor", bos_id=1, eos_id=2).doc_ids[None].to(device)
    g = torch.Generator(device="cpu").manual_seed(length)
    q, k, v = (torch.randn(1, h, length, dim, generator=g).to(device, torch.bfloat16) for h in (hq, hkv, hkv))
    gout = torch.randn(1, hq, length, dim, generator=g).to(device, torch.bfloat16)
    ref_out, ref_grads = _reference_chunked(q, k, v, doc_ids, sizes.reference_chunk, gout)
    errors = {}
    for impl in ("blocked", "flex"):
        backward = not (impl == "flex" and device == "cpu")
        leaves = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
        sync(device)
        started = time.perf_counter()
        with torch.set_grad_enabled(backward):
            # (ignore: mypy cannot count the list; leaves are q, k, v)
            out = document_attention(*leaves, doc_ids, impl=impl)  # type: ignore[call-arg, arg-type]
            grads = torch.autograd.grad(out, leaves, gout) if backward else ref_grads
        sync(device)
        errors[impl] = _errors(out, grads, ref_out, ref_grads)
        bound = (2 * errors["blocked"][0] + 1e-3, 2 * errors["blocked"][1] + 1e-3)
        record(
            "flex_vs_dense",
            seq_len=length,
            impl=impl,
            dtype="bfloat16",
            backward=backward,
            max_out_error=errors[impl][0],
            grad_relative_error=errors[impl][1] if backward else None,
            bound=None if impl == "blocked" else bound,
            first_call_s=time.perf_counter() - started,  # compile included for flex
            documents=len(docs),
            compiled_graphs={"/".join(map(str, key)): n for key, n in flex_compile_counts().items()},
        )
    del q, k, v, gout, ref_out, ref_grads
    empty_cache(device)
    assert errors["flex"][0] <= bound[0], (errors, bound)
    assert device == "cpu" or errors["flex"][1] <= bound[1], (errors, bound)


# ----------------------------------------------------------------------------- 3. training steps


# (paradigm, precision settings) trained: the recipe's autocast under full and anchor, and the
# paper recipes' regime (bf16_full, cos/sin in bf16: train.regime) under anchor.
TRAIN_RUNS = (("full", ()), ("anchor", ()), ("anchor", ("dtype=bf16_full", "rope_precision=bf16")))


@pytest.mark.parametrize("paradigm, precision", TRAIN_RUNS, ids=["full", "anchor", "anchor-bf16_full"])
def test_train_steps(paradigm, precision, device, sizes, record, tmp_path):
    from evalkit.train import load_recipe, memory, train
    from evalkit.train.loop import METRICS
    from tests.gpu.serving import flex_compile_counts

    run_dir = tmp_path / f"tiny-gpu-{paradigm}"
    sets = [*sizes.train_sets, f"max_steps={sizes.train_steps}", *precision]
    config = load_recipe("tiny-gpu", {"paradigm": paradigm, "out": str(run_dir)}, sets)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    try:
        train(config, show_progress=False)
    finally:  # the steps that ran are recorded even when a later one fails
        records = read_results(run_dir / METRICS) if (run_dir / METRICS).is_file() else []
        timed = records[1:] or records  # the first step compiles

        def mean(key: str) -> float | None:
            return sum(r[key] for r in timed) / len(timed) if timed else None

        record(
            "train_steps",
            recipe="tiny-gpu",
            paradigm=paradigm,
            steps=len(records),
            attention=config.model.attention,
            dtype=config.dtype,
            rope_precision=config.rope_precision,
            tokens_per_step=config.windows_per_step * config.seq_len,
            tokens_per_s=mean("tokens_per_s"),
            step_s=mean("step_s"),  # the step alone, synchronised
            data_s=mean("data_s"),  # building the windows
            first_step_s=records[0]["step_s"] if records else None,
            loss_first=records[0]["loss"] if records else None,
            loss_last=records[-1]["loss"] if records else None,
            peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
            # the memory model's per-GPU estimate beside the measured peak (train --memory-estimate)
            memory_estimate_gib=memory.estimate(config, memory.architecture(config, vocab_size(config)), 1).total
            / 2**30,
            compiled_graphs={"/".join(map(str, key)): n for key, n in flex_compile_counts().items()},
            wall_s=time.perf_counter() - started,
        )
    assert len(records) == sizes.train_steps
    assert all(r["tokens_per_s"] > 0 and r["step_s"] > 0 and r["data_s"] >= 0 for r in records)


def vocab_size(config) -> int:
    """The tokenizer's size, as the memory model counts the embedding of a model built from scratch."""
    from evalkit.train.model import recipe_tokenizer

    return len(recipe_tokenizer(config))
