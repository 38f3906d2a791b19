"""The released code's precision regime (dtype=bf16_full) against references written here from its
description (shared/paper.md section 1; docs/training.md): bf16 weights, buffers and residual
stream, fp32 master weights and AdamW state, gradients accumulated in fp32 or (grad_accum_dtype=bf16,
DeepSpeed 0.14 ZeRO-3's) in bf16, and RoPE rotated from bf16 frequencies with cos/sin cast to bf16.
The references use torch and transformers directly, never evalkit.train.regime."""

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evalkit.errors import UserError
from evalkit.store.result_format import training_precision
from evalkit.train.distributed import DistContext
from evalkit.train.loop import build_stream, build_training, collate, compute_weights, optimizer_step, train
from evalkit.train.model import recipe_tokenizer
from tests.train.helpers import losses, micro_args, micro_config

BF16 = torch.bfloat16


def _setup(tmp_path: Path, *sets: str):
    config = micro_config(tmp_path / "run", "dtype=bf16_full", *sets, paradigm="anchor")
    tokenizer = recipe_tokenizer(config)
    ctx = DistContext()
    model, optimizer, _ = build_training(config, tokenizer, ctx)
    _, stream = build_stream(config, tokenizer)
    return config, ctx, model, optimizer, stream


def _rotary(model):
    (rotary,) = [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]
    return rotary


def test_the_model_computes_in_bf16_and_the_optimizer_keeps_fp32_masters(tmp_path):
    config, ctx, model, optimizer, stream = _setup(tmp_path, "rope_precision=bf16")
    seen = {"weights": set(), "hidden": set(), "inv_freq": set()}

    def before(layer, args, kwargs):
        seen["weights"].update(p.dtype for p in layer.parameters())
        seen["inv_freq"].add(_rotary(model).inv_freq.dtype)

    def after(layer, args, kwargs, output):
        hidden = output[0] if isinstance(output, tuple) else output
        seen["hidden"].add(hidden.dtype)

    decoder = model.lm.model
    hooks = [layer.register_forward_pre_hook(before, with_kwargs=True) for layer in decoder.layers]
    hooks += [layer.register_forward_hook(after, with_kwargs=True) for layer in decoder.layers]
    hooks.append(decoder.embed_tokens.register_forward_hook(lambda m, a, out: seen["hidden"].add(out.dtype)))
    windows = [stream.next_window() for _ in range(config.windows_per_step)]
    optimizer_step(model, optimizer, windows, config, ctx, torch.autocast("cpu", enabled=False), step=1)
    for hook in hooks:
        hook.remove()
    assert seen == {"weights": {BF16}, "hidden": {BF16}, "inv_freq": {BF16}}
    # Between steps the parameters are the optimizer's fp32 masters, with fp32 AdamW moments.
    assert {p.dtype for group in optimizer.param_groups for p in group["params"]} == {torch.float32}
    moments = [t for state in optimizer.state.values() for k, t in state.items() if k != "step"]
    assert moments and {t.dtype for t in moments} == {torch.float32}


def test_rope_fp32_keeps_the_frequencies_in_fp32_and_autocast_keeps_every_buffer(tmp_path):
    _, _, model, _, _ = _setup(tmp_path, "rope_precision=fp32")
    assert _rotary(model).inv_freq.dtype == torch.float32
    autocast = micro_config(tmp_path / "autocast", "dtype=bf16", "rope_precision=bf16")
    model, _, _ = build_training(autocast, recipe_tokenizer(autocast), DistContext())
    assert {b.dtype for b in model.buffers() if b.is_floating_point()} == {torch.float32}


def _bf16_copy_gradients(masters, windows, ctx):
    """Each window's gradient (micro_batch 1) on a bf16 copy of the fp32 model (parameters and
    buffers, as casting the model does), the loss divided by the batch's target count."""
    bf16_copy = copy.deepcopy(masters).to(BF16)
    for p, master in zip(bf16_copy.parameters(), masters.parameters()):
        assert torch.equal(p, master.to(BF16))
    num_targets = sum(int(w.loss_mask[1:].sum()) for w in windows)
    gradients = []
    for window in windows:
        (bf16_copy(**collate([window], ctx.device)) / num_targets).backward()
        assert {p.grad.dtype for p in bf16_copy.parameters()} == {BF16}
        gradients.append([p.grad for p in bf16_copy.parameters()])
        bf16_copy.zero_grad(set_to_none=True)
    return gradients


def _accumulate(gradients, accumulate: str):
    """Sum per parameter over micro-batches: in fp32, or in bf16, rounded after each add (the sum of
    two bf16 values is exact in fp32; rounding it is the bf16 add)."""
    sums = [g.float() for g in gradients[0]]
    for micro in gradients[1:]:
        for total, g in zip(sums, micro):
            total += g.float()
            if accumulate == "bf16":
                total.copy_(total.to(BF16))
    return sums


def _reference_step(masters, grads, config):
    for master, grad in zip(masters.parameters(), grads):
        master.grad = grad
    if config.optim.grad_clip:
        torch.nn.utils.clip_grad_norm_(list(masters.parameters()), config.optim.grad_clip)
    o = config.optim
    reference = torch.optim.AdamW(
        masters.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    reference.step()


@pytest.mark.parametrize("accumulate", ["fp32", "bf16"])
def test_one_step_equals_a_hand_written_fp32_master_bf16_copy_step_bitwise(tmp_path, accumulate):
    """The reference: 8 micro-batches' bf16 gradients on a bf16 copy, added into fp32 ones or
    (grad_accum_dtype=bf16) into bf16 ones, clipping and AdamW on the fp32 masters; the masters
    after the step are the trainer's parameters, bit for bit."""
    sets = ["rope_precision=bf16", "optim.grad_clip=0.5", "windows_per_step=8", f"grad_accum_dtype={accumulate}"]
    config, ctx, model, optimizer, stream = _setup(tmp_path, *sets)
    masters = copy.deepcopy(model)
    windows = [stream.next_window() for _ in range(config.windows_per_step)]
    gradients = _bf16_copy_gradients(masters, windows, ctx)
    grads = _accumulate(gradients, accumulate)
    if accumulate == "bf16":  # the rounding matters here: the comparison below tells the two apart
        assert any(not torch.equal(a, b) for a, b in zip(grads, _accumulate(gradients, "fp32")))
    _reference_step(masters, grads, config)

    optimizer_step(model, optimizer, windows, config, ctx, torch.autocast("cpu", enabled=False), step=1)
    for (name, mine), theirs in zip(model.named_parameters(), masters.parameters()):
        assert mine.dtype == torch.float32 and torch.equal(mine, theirs), name


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _released_rotation(x_bf16, positions, theta, frequencies_dtype):
    """The released code's formula: RoPE frequencies as the model computes them (fp32) in the
    model's buffer dtype, angles in fp32, cos/sin cast to bf16, every product in bf16."""
    dim = x_bf16.shape[-1]
    inv_freq = (1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)).to(frequencies_dtype)
    angles = positions.float()[:, None] * inv_freq.float()[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(BF16), angles.sin().to(BF16)
    return x_bf16 * cos + _rotate_half(x_bf16) * sin


def _paper_text_rotation(x_bf16, positions, theta):
    """The paper's text: the rotation in fp32 (fp32 frequencies, cos, sin), rounded once to bf16."""
    dim = x_bf16.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return (x_bf16.float() * angles.cos() + _rotate_half(x_bf16.float()) * angles.sin()).to(BF16)


def _kernel_inputs(tmp_path, rope: str, monkeypatch):
    """q, k reaching the first layer's kernel and that layer's projections, at positions 3000.."""
    from evalkit.attention import kernels

    config, ctx, model, _, _ = _setup(tmp_path / rope, f"rope_precision={rope}", "model.attention=blocked")
    attention = model.lm.model.layers[0].self_attn
    captured = {}
    hooks = [
        attention.q_proj.register_forward_hook(lambda m, a, out: captured.setdefault("q", out)),
        attention.k_proj.register_forward_hook(lambda m, a, out: captured.setdefault("k", out)),
    ]
    blocked = kernels._FUNCTIONS["blocked"]

    def spy(q, k, v, doc_ids, **kwargs):
        captured.setdefault("kernel", (q, k))
        return blocked(q, k, v, doc_ids, **kwargs)

    monkeypatch.setitem(kernels._FUNCTIONS, "blocked", spy)
    positions = torch.arange(3000, 3064)
    with compute_weights(model, config, ctx), torch.no_grad():
        model.lm.model(input_ids=torch.arange(64)[None] % 100 + 5, position_ids=positions[None], use_cache=False)
    for hook in hooks:
        hook.remove()
    hf = model.lm.config
    head_dim = hf.hidden_size // hf.num_attention_heads

    def heads(x):
        return x.view(1, x.shape[1], -1, head_dim).transpose(1, 2)[0]

    theta = hf.rope_parameters["rope_theta"]
    return captured["kernel"], heads(captured["q"]), heads(captured["k"]), positions, theta


def test_rope_bf16_rotates_as_the_released_formula_and_fp32_as_the_paper_text(tmp_path, monkeypatch):
    (q_kernel, k_kernel), q, k, positions, theta = _kernel_inputs(tmp_path, "bf16", monkeypatch)
    assert q.dtype == BF16 and q_kernel.dtype == BF16
    torch.testing.assert_close(q_kernel[0], _released_rotation(q, positions, theta, BF16), atol=0, rtol=0)
    torch.testing.assert_close(k_kernel[0], _released_rotation(k, positions, theta, BF16), atol=0, rtol=0)
    # The bf16 frequencies are the point: fp32 frequencies with the same casts rotate elsewhere.
    assert not torch.equal(q_kernel[0], _released_rotation(q, positions, theta, torch.float32))

    (q_kernel, k_kernel), q, k, positions, theta = _kernel_inputs(tmp_path, "fp32", monkeypatch)
    assert q_kernel.dtype == BF16  # q·k in bf16
    torch.testing.assert_close(q_kernel[0], _paper_text_rotation(q, positions, theta), atol=0, rtol=0)
    torch.testing.assert_close(k_kernel[0], _paper_text_rotation(k, positions, theta), atol=0, rtol=0)
    assert not torch.equal(q_kernel[0], _released_rotation(q, positions, theta, BF16))


def test_each_checkpoint_records_the_regime_and_resumes_exactly(tmp_path):
    sets = ["dtype=bf16_full", "rope_precision=bf16", "grad_accum_dtype=bf16", "checkpoint.every=2"]
    straight = train(micro_config(tmp_path / "straight", *sets, max_steps=4), show_progress=False)
    first = train(micro_config(tmp_path / "resumed", *sets, max_steps=2), show_progress=False)
    train(micro_config(first, *sets, max_steps=4), resume=True, show_progress=False)
    assert losses(first) == losses(straight)  # the fp32 masters and AdamW state travel in the trainer state
    meta = json.loads((first / "step-4" / "meta.json").read_text())
    assert meta["precision"] == {
        "dtype": "bf16_full", "rope": "bf16", "weights": "bf16", "buffers": "bf16", "residual": "bf16",
        "rotation": "bf16", "master": "fp32", "grad_accum": "bf16",
    }  # fmt: skip
    assert training_precision(meta) == "bf16 full, RoPE bf16"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(first / "step-4" / "model.safetensors")).values()} == {BF16}
    # Resuming in the other accumulation is refused; a run saved before the setting accumulated in fp32.
    fp32 = [*sets[:2], "grad_accum_dtype=fp32", *sets[3:]]
    with pytest.raises(UserError, match="grad_accum_dtype"):
        train(micro_config(first, *fp32, max_steps=6), resume=True, show_progress=False)
    del meta["config"]["grad_accum_dtype"]
    (first / "step-4" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="grad_accum_dtype"):
        train(micro_config(first, *sets, max_steps=6), resume=True, show_progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_fsdp2_processes_stay_close_to_one_process(tmp_path):
    """FSDP2 (2 gloo processes) under bf16_full: its policy gathers bf16 weights (the root too) and
    reduces fp32 gradients; the same losses as one process within 1e-3 over 4 steps (only the
    order of the fp32 gradient sums differs, and the bf16 copies rounded from it)."""
    sets = ["dtype=bf16_full", "rope_precision=bf16"]
    single = train(micro_config(tmp_path / "one", *sets, max_steps=4), show_progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]  # fmt: skip
    cmd = [*torchrun, "-m", "evalkit.cli", *micro_args(tmp_path / "two", *sets, max_steps=4)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(tmp_path / "two") == pytest.approx(losses(single), rel=1e-3)
    meta = json.loads((tmp_path / "two" / "step-4" / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["precision"]["residual"] == "bf16"


def test_two_fsdp2_processes_reduce_and_accumulate_in_bf16_as_a_hand_written_step(tmp_path):
    """grad_accum_dtype=bf16 on 2 gloo processes, 8 windows (4 micro-batches each, rank r taking
    windows r, r+2, ...): per micro-batch the two ranks' bf16 gradients summed once in bf16 (the
    world-size factors are powers of two: exact), the sums accumulated in bf16 rounded after each
    add, AdamW on the fp32 masters (no clipping: the sharded norm sums in another order). The step's
    saved fp32 masters equal that reference, bit for bit."""
    from evalkit.train import checkpoint as ckpt

    sets = ["dtype=bf16_full", "rope_precision=bf16", "grad_accum_dtype=bf16", "windows_per_step=8",
            "optim.grad_clip=0", "checkpoint.every=1"]  # fmt: skip
    config, ctx, model, _, stream = _setup(tmp_path, *sets)
    windows = [stream.next_window() for _ in range(config.windows_per_step)]
    gradients = _bf16_copy_gradients(model, windows, ctx)
    reduced = [  # micro-batch i: windows 2i (rank 0) and 2i + 1 (rank 1)
        [(a.float() + b.float()).to(BF16) for a, b in zip(gradients[i], gradients[i + 1])]
        for i in range(0, len(gradients), 2)
    ]
    _reference_step(model, _accumulate(reduced, "bf16"), config)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port())]  # fmt: skip
    cmd = [*torchrun, "-m", "evalkit.cli", *micro_args(tmp_path / "two", *sets, max_steps=1)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    step = tmp_path / "two" / "step-1"
    saved = torch.load(step / ckpt.TRAINER_STATE, weights_only=True)[ckpt.MASTER_WEIGHTS]
    for name, theirs in model.named_parameters():
        assert torch.equal(saved[name.removeprefix("lm.")], theirs), name
    assert json.loads((step / "meta.json").read_text())["precision"]["grad_accum"] == "bf16"
