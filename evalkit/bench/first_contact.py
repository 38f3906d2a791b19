"""First contact with a GPU: one command that settles what the CPU could not, each result written
under OUT the moment it exists.

    PYTHONPATH=. python -m evalkit.bench.first_contact --out $OUT            # one H200: under 8 minutes
    PYTHONPATH=. python -m evalkit.bench.first_contact --out DIR --device cpu   # the dry run (tests, CI)

Stages, in order, each a few JSON lines of OUT/first-contact.jsonl (appended and flushed per result;
a kill or an out-of-memory keeps everything before it), then OUT/first-contact.md at the end:

1. dtype probe: a small Llama with fp32 master weights under bf16 autocast, through evalkit's
   transformers path with each implementation available (dense, blocked, flex; flash with
   flash-attn), forward and backward: the dtypes the attention function is handed (transformers'
   own: q and k fp32, v bf16, expected) and those each kernel receives (bf16 only), under both RoPE
   precisions.
2. FlexAttention (bf16, compiled) forward and backward against an fp32 dense reference at 16K and
   64K, anchor documents, grouped-query heads; the blocked implementation in bf16 beside it, the
   error bf16 alone makes. flex passes within 2x blocked's error (+1e-3).
3. 20 training steps of the GPU recipe (tiny-gpu, 64 windows of 1K) under full and anchor:
   tokens/s, peak memory, loss, and the graphs each compiled FlexAttention function holds.
4. The vLLM plugin's kernels (evalkit/vllm_plugin/gpu_check.py): paged-cache correctness (bf16
   on CUDA, the dtype the packed path serves; bf16 and fp32 in the dry run), the FlashAttention
   cache layout, and a long run of packed prefills against Dynamo's recompile limit.

A stage that would start after --budget-s (default 360 s) is recorded as skipped, not started; reaching
Dynamo's recompile limit is an error (a failed stage), not a fall-back to eager. Needs torch,
transformers, tokenizers, safetensors, pyyaml (the lent machine's image); never imports vLLM,
flash-attn (unless installed), datasets, lm-eval or wonderwords, and downloads nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from evalkit.store.result_log import ResultLog, read_results

RESULTS = "first-contact.jsonl"
REPORT = "first-contact.md"


@dataclass
class Sizes:
    """What each stage runs at: the GPU's sizes, or the CPU dry run's."""

    attention_lengths: tuple[int, ...]
    reference_chunk: int  # queries per chunk of the fp32 reference (bounds its memory)
    heads: tuple[int, int, int]  # query heads, key/value heads, head dim
    train_sets: tuple[str, ...]  # overrides of the GPU recipe
    train_steps: int
    vllm_check_seq: int
    vllm_steps: int
    vllm_lengths: tuple[int, int]


GPU = Sizes(
    attention_lengths=(16384, 65536),
    reference_chunk=4096,
    heads=(8, 2, 128),
    train_sets=("data.num_retrieval_docs=20000", "checkpoint.every=1000", "checkpoint.final_count=1"),
    train_steps=20,
    vllm_check_seq=8192,
    vllm_steps=12,
    vllm_lengths=(8192, 32768),
)
CPU = Sizes(
    attention_lengths=(256,),
    reference_chunk=64,
    heads=(4, 2, 32),
    train_sets=(
        "seq_len=128",
        "windows_per_step=2",
        "micro_batch=2",
        "model.hidden_size=32",
        "model.intermediate_size=64",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.num_kv_heads=2",
        "model.attention=blocked",  # FlexAttention has no CPU backward
        "data.num_retrieval_docs=200",
        "checkpoint.every=1000",
        "checkpoint.final_count=1",
    ),
    train_steps=2,
    vllm_check_seq=300,
    vllm_steps=2,
    vllm_lengths=(200, 300),
)


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


def probe_dtypes(log: ResultLog, device: str) -> bool:
    from evalkit.attention import available_implementations, pack
    from evalkit.attention.hf import set_rope_precision

    packed = pack([[5] * 300, [6] * 200, [7] * 400], 512, "anchor", bos_id=1, eos_id=2)
    batch = {
        "input_ids": packed.input_ids[None].to(device),
        "position_ids": packed.position_ids[None].to(device),
        "doc_ids": packed.doc_ids[None].to(device),
    }
    ok = True
    impls = available_implementations(device)
    impls += ["flex"] if "flex" not in impls else []  # on a CPU: forward only (no CPU backward)
    # Values, not dtypes only: each implementation's bf16 logits against the fp32 model's, judged as
    # the flex stage judges (within twice the blocked implementation's error, the CPU-tested one).
    with torch.no_grad():
        reference = _probe_model("dense", device)(**batch, use_cache=False).logits.float()
    blocked_error = {
        rope: _autocast_error(_probe_model("blocked", device), rope, batch, reference) for rope in ("fp32", "bf16")
    }
    for impl in impls:
        backward = not (impl == "flex" and device == "cpu")
        for rope in ("fp32", "bf16"):
            model = _probe_model(impl, device)
            set_rope_precision(model, rope)
            error, value_error = None, None
            with _dtype_spies(impl) as (handed, received):
                try:
                    with torch.set_grad_enabled(backward), torch.autocast(device, dtype=torch.bfloat16):
                        logits = model(**batch, use_cache=False).logits
                    value_error = float((logits.detach().float() - reference).abs().max())
                    if backward:
                        logits.float().logsumexp(-1).mean().backward()
                except Exception as err:  # noqa: BLE001 -- the probe records what fails on this machine
                    error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            values_ok = value_error is not None and value_error <= 2 * blocked_error[rope] + 1e-3
            passed = error is None and bool(received) and set(received) == {("bfloat16",) * 4} and values_ok
            ok &= passed
            log.write(
                "dtype_probe",
                impl=impl,
                rope_precision=rope,
                backward=backward,
                handed_by_transformers=sorted(set(handed)),
                kernel_q_k_v_out=sorted(set(received)),
                max_abs_logit_error_vs_fp32=value_error,
                blocked_error_vs_fp32=blocked_error[rope],
                error=error,
                passed=passed,
            )
    return ok


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


def flex_against_dense(log: ResultLog, device: str, sizes: Sizes) -> bool:
    from evalkit.attention import document_attention, pack
    from evalkit.attention.kernels import flex_compile_counts
    from evalkit.vllm_plugin.gpu_check import document_lengths

    hq, hkv, dim = sizes.heads
    ok = True
    for length in sizes.attention_lengths:
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
            _sync(device)
            started = time.perf_counter()
            with torch.set_grad_enabled(backward):
                # (ignore: mypy cannot count the list; leaves are q, k, v)
                out = document_attention(*leaves, doc_ids, impl=impl)  # type: ignore[call-arg, arg-type]
                grads = torch.autograd.grad(out, leaves, gout) if backward else ref_grads
            _sync(device)
            out_error, grad_error = _errors(out, grads, ref_out, ref_grads)
            errors[impl] = (out_error, grad_error)
            bound = (2 * errors["blocked"][0] + 1e-3, 2 * errors["blocked"][1] + 1e-3)
            passed = impl == "blocked" or (out_error <= bound[0] and (not backward or grad_error <= bound[1]))
            ok &= passed
            log.write(
                "flex_vs_dense",
                seq_len=length,
                impl=impl,
                dtype="bfloat16",
                backward=backward,
                max_out_error=out_error,
                grad_relative_error=grad_error if backward else None,
                bound=None if impl == "blocked" else bound,
                first_call_s=time.perf_counter() - started,  # compile included for flex
                documents=len(docs),
                compiled_graphs={"/".join(map(str, key)): n for key, n in flex_compile_counts().items()},
                passed=passed,
            )
        del q, k, v, gout, ref_out, ref_grads
        _empty_cache(device)
    return ok


# ----------------------------------------------------------------------------- 3. training steps


# (paradigm, precision settings) trained: the recipe's autocast under full and anchor, and the
# paper recipes' regime (bf16_full, cos/sin in bf16: train.regime) under anchor.
TRAIN_RUNS = (("full", ()), ("anchor", ()), ("anchor", ("dtype=bf16_full", "rope_precision=bf16")))


def train_steps(log: ResultLog, device: str, sizes: Sizes, runs_dir: Path) -> bool:
    from evalkit.attention.kernels import flex_compile_counts
    from evalkit.train import load_recipe, memory, train
    from evalkit.train.loop import METRICS

    ok = True
    for paradigm, precision in TRAIN_RUNS:
        run_dir = runs_dir / f"tiny-gpu-{paradigm}{'-' + precision[0].split('=')[1] if precision else ''}"
        sets = [*sizes.train_sets, f"max_steps={sizes.train_steps}", *precision]
        config = load_recipe("tiny-gpu", {"paradigm": paradigm, "out": str(run_dir)}, sets)
        _reset_peak(device)
        started = time.perf_counter()
        error = None
        try:
            train(config, show_progress=False)
        except Exception as err:  # noqa: BLE001 -- recorded: the next paradigm still runs
            error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            traceback.print_exc()
        wall = time.perf_counter() - started
        records = read_results(run_dir / METRICS) if (run_dir / METRICS).is_file() else []
        timed = records[1:] or records  # the first step compiles
        passed = error is None and len(records) == sizes.train_steps
        ok &= passed
        log.write(
            "train_steps",
            recipe="tiny-gpu",
            paradigm=paradigm,
            steps=len(records),
            attention=config.model.attention,
            dtype=config.dtype,
            rope_precision=config.rope_precision,
            tokens_per_step=config.windows_per_step * config.seq_len,
            tokens_per_s=sum(r["tokens_per_s"] for r in timed) / len(timed) if timed else None,
            step_s=sum(r["step_s"] for r in timed) / len(timed) if timed else None,  # the step alone, synchronised
            data_s=sum(r["data_s"] for r in timed) / len(timed) if timed else None,  # building the windows
            first_step_s=records[0]["step_s"] if records else None,
            loss_first=records[0]["loss"] if records else None,
            loss_last=records[-1]["loss"] if records else None,
            peak_memory_gib=_peak_gib(device),
            # the memory model's per-GPU estimate beside the measured peak (train --memory-estimate)
            memory_estimate_gib=memory.estimate(config, memory.architecture(config, vocab_size(config)), 1).total
            / 2**30,
            compiled_graphs={"/".join(map(str, key)): n for key, n in flex_compile_counts().items()},
            wall_s=wall,
            error=error,
            passed=passed,
        )
    return ok


def vocab_size(config) -> int:
    """The tokenizer's size, as the memory model counts the embedding of a model built from scratch."""
    from evalkit.train.model import recipe_tokenizer

    return len(recipe_tokenizer(config))


def flash_attn_row(log: ResultLog) -> None:
    """flash-attn is no stage of its own: a row says whether it could be checked at all."""
    import importlib.util

    present = importlib.util.find_spec("flash_attn") is not None
    log.write("flash_attn", outcome="present: see the dtype probe" if present else "not run: absent", passed=True)


# ----------------------------------------------------------------------------- 4. vLLM kernels


def vllm_kernels(log: ResultLog, device: str, sizes: Sizes) -> bool:
    from evalkit.vllm_plugin.gpu_check import run_checks

    # bf16 only on CUDA: the packed path refuses fp32 there (vLLM's FlashAttention serves bf16/fp16),
    # and each dtype is another FlexAttention function to compile.
    dtypes = (torch.bfloat16,) if device == "cuda" else (torch.bfloat16, torch.float32)
    correct, layout_row, long_row = run_checks(
        log, sizes.vllm_check_seq, sizes.vllm_steps, sizes.vllm_lengths, device, dtypes
    )
    return all(ok for *_, ok in [*correct, layout_row, long_row])


# ----------------------------------------------------------------------------- driver


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _empty_cache(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def _reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def _machine(device: str) -> dict:
    import platform

    import transformers

    info: dict[str, str | None] = {
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    info["python"] = platform.python_version()
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    return info


def run_stages(log: ResultLog, device: str, sizes: Sizes, runs_dir: Path, budget_s: float) -> dict[str, str]:
    """Every stage in order; {stage: passed | FAILED | error ... | skipped ...}."""
    stages: list[tuple[str, Callable[[], bool]]] = [
        ("dtype_probe", lambda: probe_dtypes(log, device)),
        ("flex_vs_dense", lambda: flex_against_dense(log, device, sizes)),
        ("train_steps", lambda: train_steps(log, device, sizes, runs_dir)),
        ("vllm_kernels", lambda: vllm_kernels(log, device, sizes)),
    ]
    started = time.monotonic()
    outcome = {}
    for name, stage in stages:
        if time.monotonic() - started > budget_s:
            outcome[name] = f"skipped: started after the {budget_s:.0f} s budget"
        else:
            try:
                outcome[name] = "passed" if stage() else "FAILED"
            except Exception as err:  # noqa: BLE001 -- one stage's failure must not cost the others
                traceback.print_exc()
                outcome[name] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
                _empty_cache(device)
        log.write("stage", stage=name, outcome=outcome[name], stage_end_s=round(time.monotonic() - started, 1))
    return outcome


def write_report(out: Path, command: str, outcome: dict[str, str]) -> None:
    from evalkit.files import atomic_write_text
    from evalkit.store.provenance import provenance_lines

    lines = [
        "# evalkit first contact",
        "",
        f"Command: `{command}`",
        "",
        "| stage | outcome |",
        "|---|---|",
        *(f"| {name} | {result} |" for name, result in outcome.items()),
        "",
        f"Every result, one JSON line each, in {RESULTS}:",
        "",
        "```",
        *(line for line in (out / RESULTS).read_text(encoding="utf-8").splitlines() if line.strip()),
        "```",
        "",
        *provenance_lines(),
    ]
    atomic_write_text(out / REPORT, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where first-contact.jsonl and .md go")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the dry run, small sizes")
    parser.add_argument("--budget-s", type=float, default=360.0, help="no stage starts after this many seconds")
    parser.add_argument("--runs-dir", type=Path, default=None, help="training runs (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on a GPU machine, or --device cpu for the dry run", file=sys.stderr)
        return 2
    if (args.out / RESULTS).exists():
        print(f"{args.out / RESULTS} exists: give a new --out (results are appended, never mixed)", file=sys.stderr)
        return 2
    from evalkit.attention.kernels import fail_on_recompile_limit

    fail_on_recompile_limit()
    args.out.mkdir(parents=True, exist_ok=True)
    log = ResultLog(args.out / RESULTS)
    log.write("machine", **_machine(args.device))
    flash_attn_row(log)
    sizes = GPU if args.device == "cuda" else CPU
    with tempfile.TemporaryDirectory(prefix="evalkit-first-contact-") as scratch:
        runs_dir = args.runs_dir or Path(scratch)
        outcome = run_stages(log, args.device, sizes, runs_dir, args.budget_s)
    command = "python -m evalkit.bench.first_contact " + " ".join(argv if argv is not None else sys.argv[1:])
    write_report(args.out, command, outcome)
    print("\n".join(f"{name}: {result}" for name, result in outcome.items()))
    return 0 if all(result == "passed" for result in outcome.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
