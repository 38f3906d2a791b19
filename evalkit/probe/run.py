"""`run_probe`: load the checkpoint per condition, measure, write JSON rows, plots and a summary."""

from __future__ import annotations

import gc
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from evalkit.attention.features import check_attention_supported, layer_windows, windows_shorter_than
from evalkit.attention.hf import cast_buffers, rotary_modules
from evalkit.errors import UserError
from evalkit.files import atomic_write_json, atomic_write_text, check_output_dir, output_lock, refuse_foreign
from evalkit.models.check import (
    check_checkpoint,
    checkpoint_directory,
    checkpoint_source,
    load_config,
    load_pretrained,
    load_tokenizer,
)
from evalkit.models.precision import resolve_device, torch_dtype
from evalkit.models.refs import checkpoint_meta
from evalkit.probe.attention import PROBE_ATTENTION, register_probe_attention
from evalkit.probe.measure import ShiftMeasurement, measure_shifts
from evalkit.probe.options import ProbeOptions, ProbePlan, check_kind
from evalkit.probe.report import TITLE, summarise, summary_markdown, write_plots
from evalkit.probe.texts import TextSource, TokenWindows

MEASUREMENT = {
    "attn_diff": "D(X, Δ1, Δ2) = Σ_(l,h) Σ_j n_j Σ_i |ATTN_ij(Δ1) − ATTN_ij(Δ2)|, n_j = 1/(T − j + 1) (Eq. 4)",
    "attn_diff_column": "the same, kept per 1-based key column j (`column`); the columns sum to attn_diff",
    "first_token_share": "attn_diff_column at j = 1 over attn_diff",
    "logit_diff_first": "D_logit = (1/T) Σ_i Σ_(l,h) |A_i1(Δ1) − A_i1(Δ2)| (Eq. 5), A = q·k/sqrt(d) in the "
    "activation dtype: the 1/sqrt(d) scale is included, as the softmax sees it",
    "attention": "post-softmax probabilities of every layer and head as transformers' eager attention computes them "
    "(logits in the activation dtype, softmax in FP32, cast back), each layer within its own sliding window if it "
    "has one; value = mean over texts, std = their spread",
    "windows": "in a layer with a sliding window W, n_j = 1/min(W, T − j + 1) and D_logit's 1/T is 1/min(W, T): one "
    "over the entries that layer attends to (as Eq. 4 and 5 count them under full attention)",
    "layers": "which layers a row sums over: all, or one layer type (full_attention, sliding_attention, from the "
    "window each layer attended with); the types add up to all",
}
OUTPUTS = {"json": "json", "markdown": "md", "png": "png", "svg": "svg"}  # probe-<kind>.<suffix> of each


def model_window(config) -> int:
    """The longest sequence the probe measures on this model: max_position_embeddings (each layer
    within its own sliding window, if any)."""
    window = getattr(config, "max_position_embeddings", None)
    if not window:
        raise UserError(f"the checkpoint's config ({config.model_type}) states no max_position_embeddings")
    return int(window)


def describe_window(config) -> str:
    """The model's window in words, e.g. "32768-token window (15 of its 18 layers slide over 512 tokens)"."""
    window = model_window(config)
    windows = layer_windows(config)
    sliding = [w for w in windows if w is not None and w < window]
    if not sliding:
        return f"{window}-token window"
    reach = ", ".join(str(w) for w in sorted(set(sliding)))
    which = "all its" if len(sliding) == len(windows) else f"{len(sliding)} of its"
    return f"{window}-token window ({which} {len(windows)} layers slide over {reach} tokens)"


def trained_regime(checkpoint: Path) -> dict | None:
    """The precision an evalkit run trained the checkpoint in (meta.json's `precision`), else None."""
    precision = checkpoint_meta(Path(checkpoint)).get("precision")
    return precision if isinstance(precision, dict) else None


def as_trained(condition: str, dtype: str, trained: dict | None) -> bool:
    """The BF16 condition of a checkpoint trained under bf16_full runs as it trained: bf16 buffers
    (RoPE's frequencies, unless it rotated in fp32) beside its bf16 weights and residual stream."""
    return condition == "pretrained" and dtype == "bf16" and (trained or {}).get("dtype") == "bf16_full"


def load_model(checkpoint: Path, config, condition: str, dtype: str, device: torch.device, seed: int = 0, trained=None):
    """The checkpoint's base model (no LM head: the probe needs attention only) with the probe attention.

    The model is built in its dtype rather than cast afterwards: `.to(bf16)` would also round
    RoPE's inverse frequencies, which transformers keeps in FP32 when it loads a model; a model
    trained with them rounded (bf16_full, `trained` its meta.json record) gets them rounded here too.
    """
    from transformers import AutoModel

    register_probe_attention()
    common: dict[str, Any] = {"dtype": torch_dtype(dtype), "attn_implementation": PROBE_ATTENTION}
    if condition == "random_init":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModel.from_config(config, **common).to(device).eval()
    # A causal-LM checkpoint's lm_head has no place in the base model: left out on purpose.
    # run_probe reports its own progress: no loading bar.
    model = load_pretrained(AutoModel, checkpoint, allowed_unexpected=("lm_head.",), progress_bar=False, **common)
    if as_trained(condition, dtype, trained):
        cast_buffers(model, (trained or {}).get("rope", "bf16"))
    return model.to(device).eval()


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype))


def loaded_regime(model, condition: str, dtype: str, trained: dict | None) -> dict:
    """What one condition computed in, read off the loaded model: weights (and so the residual
    stream), RoPE's frequencies, and whether it is the regime the checkpoint trained in."""
    weights = _dtype_name(next(model.parameters()).dtype)
    # Gemma 3 keeps one table per layer type (full_attention_inv_freq, sliding_attention_inv_freq)
    buffers = [b for m in rotary_modules(model) for name, b in m.named_buffers() if name.endswith("inv_freq")]
    frequencies = {_dtype_name(b.dtype) for b in buffers}
    return {
        "condition": condition,
        "dtype": dtype,
        "weights": weights,
        "residual": weights,
        "rope_frequencies": ", ".join(sorted(frequencies)) or "?",
        "as_trained": as_trained(condition, dtype, trained),
    }


def _std(values: torch.Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


def measurement_rows(kind: str, found: ShiftMeasurement, condition: str, dtype: str, rope: str) -> list[dict]:
    """Long-form rows for one (condition, dtype, rope, Δ1, length); `column` is set only per-column.

    Rows sum over `found.layers` ("all"); a model with more than one layer type also gets the
    same rows per layer type."""
    base = {
        "kind": kind,
        "condition": condition,
        "dtype": dtype,
        "rope": rope,
        "delta1": found.delta1,
        "delta2": found.delta2,
        "length": found.seq_len,
        "n_texts": found.n_texts,
        "layers": found.layers,
    }

    def row(metric: str, value: float, std: float | None = None, column: int | None = None) -> dict:
        return {"metric": metric, **base, "column": column, "value": value, "std": std}

    if kind == "length":
        rows = [row("logit_diff_first", found.logit_first, _std(found.per_text_logit_first))]
    else:
        rows = [row("attn_diff", found.total, _std(found.per_text_total))]
    if kind == "tokens":
        rows += [row("attn_diff_column", float(v), column=j) for j, v in enumerate(found.columns.tolist(), start=1)]
        rows.append(row("first_token_share", found.first_token_share))
    if len(found.by_layer_type) > 1:  # the parts hold no parts of their own
        for part in found.by_layer_type.values():
            rows += measurement_rows(kind, part, condition, dtype, rope)
    return rows


def _require_finite(found: ShiftMeasurement, label: str) -> None:
    values = torch.cat([found.per_text_total, found.per_text_logit_first])
    if not bool(torch.isfinite(values).all()):
        raise UserError(f"{label}: the attention produced non-finite values (an overflow in this dtype?)")


def _measure_all(
    plan: ProbePlan,
    options: ProbeOptions,
    checkpoint: Path,
    config,
    windows: dict[int, TokenWindows],
    device: torch.device,
    progress: Callable[[str], None] | None,
    trained: dict | None,
) -> tuple[list[dict], list[dict]]:
    """Every condition's rows, and what each condition computed in (`trained`: trained_regime's answer)."""
    rows: list[dict] = []
    regimes: list[dict] = []
    for condition, dtype in plan.conditions:
        if progress is not None:
            progress(f"loading the {'checkpoint' if condition == 'pretrained' else 'random-init model'} in {dtype}")
        model = load_model(checkpoint, config, condition, dtype, device, options.seed, trained)
        regimes.append(loaded_regime(model, condition, dtype, trained))
        for rope in options.rope:
            for length in plan.lengths:
                label = f"{condition} {dtype} rope={rope} T={length}"
                say = (lambda message, label=label: progress(f"{label}: {message}")) if progress else None
                found = measure_shifts(
                    model,
                    windows[length].ids_NT,
                    plan.delta1,
                    plan.delta2,
                    rope=rope,
                    shifts_per_batch=options.shifts_per_batch,
                    progress=say,
                )
                for measurement in found:
                    _require_finite(measurement, label)
                    rows += measurement_rows(plan.kind, measurement, condition, dtype, rope)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, regimes


def _notes(plan: ProbePlan, config, windows: dict[int, TokenWindows], requested: int, source: TextSource) -> list[str]:
    notes = list(plan.notes)
    if windows_shorter_than(config, max(plan.lengths)):
        notes.append(
            f"the model's {describe_window(config)}: those layers are measured within their window, and the sums "
            "are also reported per layer type"
        )
    for length, window in sorted(windows.items()):
        if window.count < requested:
            notes.append(f"only {window.count} of the {requested} texts asked for have {length} tokens")
    if not source.first_token_is_bos():
        notes.append("the tokenizer adds no BOS, so the first token is the text's own first token")
    furthest = max(plan.lengths) - 1 + max(*plan.delta1, plan.delta2)
    if furthest >= plan.window:
        notes.append(
            f"position ids reach {furthest}, beyond the model's {plan.window}-token window (as the paper's "
            "Δ1 = 2000 at T = 4096 does for LLaMA-2)"
        )
    return notes


def _provenance(
    checkpoint: Path,
    config,
    source: TextSource,
    windows: dict[int, TokenWindows],
    plan: ProbePlan,
    options: ProbeOptions,
    device: torch.device,
) -> dict:
    import transformers

    from evalkit.corpus import tokenizer_fingerprint
    from evalkit.store.provenance import stamp

    digest = hashlib.sha256()
    for length in sorted(windows):
        digest.update(windows[length].ids_NT.numpy().tobytes())
    try:
        fingerprint = tokenizer_fingerprint(source.tokenizer)
    except (AttributeError, ValueError):  # a slow tokenizer has no backend JSON to hash
        fingerprint = None
    return {
        **stamp(),
        "transformers": transformers.__version__,
        "checkpoint": str(checkpoint),
        "model_type": config.model_type,
        "device": str(device),
        "texts": source.describe(),
        "n_texts_requested": options.n_texts,
        "n_texts": {str(n): w.count for n, w in sorted(windows.items())},
        "texts_skipped_short": {str(n): w.skipped_short for n, w in sorted(windows.items())},
        "seq_len": max(plan.lengths) if plan.kind != "length" else None,
        "lengths": list(plan.lengths),
        "first_token_is_bos": source.first_token_is_bos(),
        "tokenizer_fingerprint": fingerprint,
        "token_windows_sha256": digest.hexdigest()[:16],
        "model_window": plan.window,
        "layer_windows": layer_windows(config),  # per layer: its sliding window, null for full attention
    }


def _options_record(plan: ProbePlan, options: ProbeOptions) -> dict:
    return {
        "delta1": list(plan.delta1),
        "delta2": plan.delta2,
        "lengths": list(plan.lengths),
        "dtypes": list(options.dtypes),
        "rope": list(options.rope),
        "random_init": options.random_init,
        "seed": options.seed,
        "n_texts": options.n_texts,
        "shifts_per_batch": options.shifts_per_batch,
        "conditions": [list(pair) for pair in plan.conditions],
    }


def run_probe(
    kind: str,
    ckpt: str | Path,
    out_dir: str | Path,
    *,
    progress: Callable[[str], None] | None = None,
    command: str | None = None,
    **options,
) -> dict:
    """Run one probe kind on a checkpoint and write probe-<kind>.json, .png, .svg and .md into
    `out_dir`; returns the JSON's content plus "files" (their paths). `options` are ProbeOptions'
    fields, all checked before a model loads; `command`, the command line that asked, is recorded."""
    started = time.monotonic()
    kind, out_dir = check_kind(kind), Path(out_dir)
    probe_options = ProbeOptions(**options)
    check_output_dir(out_dir)  # before the measurement, not when its results are written
    paths = {name: out_dir / f"probe-{kind}.{suffix}" for name, suffix in OUTPUTS.items()}
    refuse_foreign(paths.values(), heading=TITLE.format(kind=kind))  # replaced when done: never a file of the user's
    hub = checkpoint_source(str(ckpt))[1]  # resolved once: checkpoint_directory reads the same answer
    checkpoint = checkpoint_directory(ckpt, "the probe")
    check_checkpoint(checkpoint)  # a broken checkpoint is refused before texts are read and tokenized
    config = load_config(checkpoint)
    check_attention_supported(config, "evalkit probe")  # the one check every command shares
    plan = probe_options.plan(kind, model_window(config), describe_window(config))
    source = TextSource(load_tokenizer(checkpoint), probe_options.texts, max_length=max(plan.lengths))
    windows = {length: source.windows(length, probe_options.n_texts) for length in plan.lengths}
    device = resolve_device(probe_options.device)

    # One writer per directory: two probes into one --out would mix one's markdown with the other's JSON.
    with output_lock(out_dir, leave_no_trace=True):
        trained = trained_regime(checkpoint)
        rows, regimes = _measure_all(plan, probe_options, checkpoint, config, windows, device, progress, trained)
        provenance = _provenance(checkpoint, config, source, windows, plan, probe_options, device)
        provenance |= {"command": command, "seconds": round(time.monotonic() - started, 1)}
        provenance |= {"trained_precision": trained, "condition_precision": regimes}
        provenance |= {"hub": hub.record()} if hub is not None else {}
        payload = {
            "kind": kind,
            "provenance": provenance,
            "options": _options_record(plan, probe_options),
            "measurement": MEASUREMENT,
            "notes": _notes(plan, config, windows, probe_options.n_texts, source),
            "summary": summarise(rows),
            "rows": rows,
        }

        write_plots(kind, rows, paths["json"].with_suffix(""))
        atomic_write_text(paths["markdown"], summary_markdown(payload))
        atomic_write_json(paths["json"], payload)  # last: a JSON on disk means the run finished
    return {**payload, "files": {name: str(path) for name, path in paths.items()}}
