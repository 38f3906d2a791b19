"""The training loop: packed windows in, checkpoints and a metrics log out, resumable at any step.

Per step, every process builds the same global batch of windows (the data order is a pure
function of the seed and the stream state), takes its share, and normalises its loss by the
global count of target tokens, so 1 process and N processes take the same optimizer step.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as activation_checkpoint

import evalkit
from evalkit.attention import PackedSequence
from evalkit.attention.anchor import anchor_note, anchor_record
from evalkit.attention.features import layer_windows
from evalkit.attention.hf import HF_NAMES, cast_buffers
from evalkit.corpus import tokenizer_fingerprint
from evalkit.errors import UserError
from evalkit.files import atomic_write_text, check_output_dir, disk_full_error, naming, output_lock, refuse_foreign
from evalkit.models.check import check_checkpoint
from evalkit.store.provenance import git_state
from evalkit.train import checkpoint as ckpt
from evalkit.train import distributed, regime
from evalkit.train.config import TrainConfig, base_model_record, check_inputs, merge_sections, recorded_config
from evalkit.train.data import DocumentSource, WindowStream, data_fingerprint, domain_tag_ids, open_source
from evalkit.train.memory import LOSS_CHUNK
from evalkit.train.model import build_model, recipe_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

METRICS = "metrics.jsonl"


def _chunk_loss(hidden: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, head_weight).float()
    return F.cross_entropy(logits, targets, reduction="sum")


class MaskedLMLoss(torch.nn.Module):
    """The HF model and its loss, the summed next-token cross-entropy over the targets loss_mask
    marks, as one module: FSDP2's root unit gathers the head weights the loss reads only inside
    the root's forward. The vocabulary projection runs in recomputed chunks, so a 64K window with a
    128K vocabulary never holds all its logits at once."""

    def __init__(self, lm: PreTrainedModel, window_anchor: str = "window"):
        super().__init__()
        self.lm = lm
        self.window_anchor = window_anchor  # how the anchor meets sliding layers' windows (attention.masks)

    def hidden_states(self, input_ids, position_ids, doc_ids) -> torch.Tensor:
        decoder = getattr(self.lm, self.lm.base_model_prefix)
        return decoder(  # use_cache=False: nothing decodes (transformers 5.17's cache would promote v to k's dtype)
            input_ids=input_ids,
            position_ids=position_ids,
            doc_ids=doc_ids,
            window_anchor=self.window_anchor,
            use_cache=False,
        ).last_hidden_state

    def forward(self, input_ids, position_ids, doc_ids, loss_mask) -> torch.Tensor:
        hidden = self.hidden_states(input_ids, position_ids, doc_ids)
        targets_mask = loss_mask[:, 1:]
        hidden = hidden[:, :-1][targets_mask]
        targets = input_ids[:, 1:][targets_mask]
        head = self.lm.get_output_embeddings().weight
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, targets.numel(), LOSS_CHUNK):
            h, t = hidden[start : start + LOSS_CHUNK], targets[start : start + LOSS_CHUNK]
            total = total + activation_checkpoint(_chunk_loss, h, head, t, use_reentrant=False)
        return total


def trainer_logprobs(checkpoint: Path, tokens: list[int], device: torch.device) -> torch.Tensor:
    """Next-token log-probabilities [T, V] of one document, `tokens`, by the trainer's own forward on
    a checkpoint it wrote: its model, attention and precision regime as its meta.json records them
    (the reference `evalkit parity` holds each engine's serving to)."""
    config = recorded_config(_read_meta(checkpoint).get("config") or {})
    config.model.path = str(checkpoint)
    model = MaskedLMLoss(build_model(config, None, device), config.model.window_anchor).eval()
    if config.dtype == "bf16_full":
        cast_buffers(model, config.rope_precision)
    ids = torch.tensor([tokens], device=device)
    positions = torch.arange(len(tokens), device=device)[None]
    with torch.no_grad(), compute_weights(model, config, distributed.DistContext()), autocast_context(config, device):
        hidden = model.hidden_states(ids, positions, None)[0]
        return F.linear(hidden, model.lm.get_output_embeddings().weight).float().log_softmax(-1).cpu()


def collate(windows: list[PackedSequence], device: torch.device) -> dict[str, torch.Tensor | None]:
    """MaskedLMLoss's inputs for a micro-batch; doc_ids None under a paradigm that masks nothing."""
    fields = ["input_ids", "position_ids", "loss_mask"]
    fields += ["doc_ids"] if windows[0].paradigm.masks_documents else []
    stacked = {name: torch.stack([getattr(w, name) for w in windows]).to(device) for name in fields}
    return {"doc_ids": None, **stacked}


def lr_lambda(config: TrainConfig):
    o = config.optim

    def factor(step: int) -> float:
        if o.warmup_steps and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - o.warmup_steps) / max(1, config.max_steps - o.warmup_steps))
        return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _check_resume_config(saved: dict, config: TrainConfig) -> None:
    """A resumed run must be the same run: only the step budget and schedule may change. A setting
    added to evalkit after the run started, missing from its saved config, takes the default: what
    the run used, new settings defaulting to the old behaviour."""
    current = config.to_dict()
    # The one setting whose default is not the old behaviour: a saved config without
    # data.window_start predates it, and its windows were packed as "document".
    saved_data = saved.get("data")
    if isinstance(saved_data, dict) and "window_start" not in saved_data:
        saved = {**saved, "data": {**saved_data, "window_start": "document"}}
    saved = merge_sections(TrainConfig().to_dict(), saved)
    was, now = saved["data"].get("window_start"), current["data"]["window_start"]
    if was != now:
        raise UserError(
            f"--resume: the run was packed with data.window_start={was}, this config asks {now}; "
            f"resume with --set data.window_start={was} (or start a new --out)"
        )
    ignore = {"max_steps", "checkpoint", "out"}
    differing = [k for k in current if k not in ignore and saved.get(k) != current[k]]
    if differing:
        raise UserError(
            f"--resume with a different config ({', '.join(differing)}); use the original settings or a new --out"
        )


def _metrics_to_keep(path: Path, step: int) -> list[str]:
    """The log lines of steps up to `step` (later ones are redone), read before any work so that a
    corrupt log stops the run before anything changes. A torn last line is a kill while appending:
    dropped, its step being newer than any checkpoint (a step is logged before it is saved). A bad
    line anywhere else is corruption: a one-line error. From step 0 nothing is kept, nor parsed."""
    if step == 0 or not path.is_file():
        return []
    numbered = enumerate(path.read_text(errors="replace").splitlines(), start=1)
    lines = [(number, line) for number, line in numbered if line.strip()]
    kept = []
    for position, (number, line) in enumerate(lines):
        logged = _logged_step(line)
        if logged is None and position == len(lines) - 1:
            break  # the torn last line
        if logged is None:
            raise UserError(
                f"{path}, line {number} is not a metrics record (the log is corrupt); delete that line, "
                "or the whole file to resume with a new log"
            )
        if logged <= step:
            kept.append(line)
    return kept


def _logged_step(line: str) -> int | None:
    """The step of one metrics line, or None when it is not a whole record."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _progress_bar(enabled: bool, description: str, total: int, start: int):
    """A rich progress bar (disabled: silent, off the main process) and its task."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}  {task.fields[tps]:,.0f} tok/s"),
        TimeRemainingColumn(),
        disable=not enabled,
    )
    return bar, bar.add_task(description, total=total, completed=start, loss=float("nan"), tps=0.0)


def optimizer_step(
    model, optimizer, windows: list[PackedSequence], config: TrainConfig, ctx, autocast, *, step: int
) -> float:
    """Optimizer step `step` on the global batch `windows`, the same for any number of processes and
    micro-batches (module docstring); returns its mean loss per target token. A non-finite loss or
    gradient stops training before the weights change."""
    mine = windows[ctx.rank :: ctx.world_size]
    num_targets = max(1, sum(int(w.loss_mask[1:].sum()) for w in windows))
    loss_sum = torch.zeros((), device=ctx.device)
    with compute_weights(model, config, ctx):
        for i in range(0, len(mine), config.micro_batch):
            batch = collate(mine[i : i + config.micro_batch], ctx.device)
            with autocast:
                micro_loss = model(**batch)
            # FSDP averages gradients over processes; scaling by world size makes it a sum.
            (micro_loss * ctx.world_size / num_targets).backward()
            if ctx.distributed and config.grad_accum_dtype == "bf16":
                distributed.round_grads(model)
            loss_sum += micro_loss.detach()
    grad_norm = _grad_norm(model, config.optim.grad_clip)
    loss = float(distributed.all_reduce_sum(loss_sum, ctx)) / num_targets
    # A NaN gradient can poison the weights while the loss is still finite; both values are global,
    # so every rank stops together.
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        raise _diverged(step, f"loss {loss:.4g}, gradient norm {grad_norm:.4g}; not applied")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def _grad_norm(model, grad_clip: float | None) -> float:
    """The total gradient norm over every rank (before clipping to grad_clip, which computes it):
    one scalar, the same on every rank, non-finite when any gradient is."""
    if grad_clip:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor, reduced here


def _diverged(step: int, what: str) -> UserError:
    return UserError(
        f"training diverged at step {step} ({what}): nothing of it was saved and the checkpoints before it are "
        "kept; lower optim.lr and train again with another --out"
    )


def compute_weights(model, config: TrainConfig, ctx):
    """The weights the step computes with: under bf16_full in one process, bf16 copies of the fp32
    masters (regime.bf16_weights); distributed, FSDP2's policy makes them (distributed.shard)."""
    if config.dtype == "bf16_full" and not ctx.distributed:
        return regime.bf16_weights(model, torch.bfloat16 if config.grad_accum_dtype == "bf16" else torch.float32)
    return nullcontext()


def autocast_context(config: TrainConfig, device: torch.device):
    """bf16 autocast without its weight cache, whose bf16 copy of every weight lives until the forward
    ends (2 bytes a parameter of peak memory: 16 GB for an 8B model) and saves no cast here: each
    weight is cast once per forward (the head once per loss chunk), and the recomputation under
    gradient checkpointing runs in an autocast region of its own."""
    if config.dtype != "bf16":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)


def train(config: TrainConfig, *, resume: bool = False, show_progress: bool = True) -> Path:
    """Run (or continue) training; returns the run directory."""
    ctx = distributed.init_distributed()
    with ExitStack() as held:  # the run directory's lock, released however training ends
        try:
            return _train(config, ctx, resume=resume, show_progress=show_progress, held=held)
        finally:
            distributed.shutdown(ctx)


def build_stream(config: TrainConfig, tokenizer, source: DocumentSource | None = None) -> tuple:
    """The run's document source (opened here unless given) and its window stream (domain tags
    resolved for anchor_tag)."""
    source = source if source is not None else open_source(config.data, config.seed, config.seq_len)
    tags = None
    if config.paradigm.uses_tags:
        domains = source.domains()
        if not domains:
            raise UserError("anchor_tag needs documents with a domain field (data.domain_field)")
        tags = domain_tag_ids(tokenizer, domains)
    stream = WindowStream(
        source, tokenizer, config.paradigm, config.seq_len, config.seed, tags, window_start=config.data.window_start
    )
    return source, stream


def build_training(
    config: TrainConfig, tokenizer, ctx: distributed.DistContext, *, initial_weights: bool = True
) -> tuple:
    """(loss module, optimizer, scheduler): the model sharded when distributed (each rank allocates
    only its shards; load_initial_weights fills them), in training mode. initial_weights=False
    leaves the weights to the caller (a resumed run's)."""
    lm = build_model(config, tokenizer, ctx.device, weights=not ctx.distributed)
    if config.grad_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(lm, "activation_checkpointing_enable"):  # the name since transformers 5.2x
            lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model = distributed.shard(MaskedLMLoss(lm, config.model.window_anchor), ctx, config.dtype, config.grad_accum_dtype)
    if ctx.distributed:
        distributed.materialize(model, ctx.device)
    if config.dtype == "bf16_full":
        cast_buffers(model, config.rope_precision)
    model.train()
    o = config.optim
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))
    if initial_weights:
        load_initial_weights(model, config, tokenizer, ctx)
    return model, optimizer, scheduler


def load_initial_weights(model, config: TrainConfig, tokenizer, ctx: distributed.DistContext) -> None:
    """Distributed and not resuming: rank 0 builds (or loads, for model.path) the model alone, on
    the CPU, and its weights reach every rank's shards by broadcast, as does its RNG state (the
    initialisation draws from it), so every rank continues as one process would."""
    if not ctx.distributed:
        return
    weights = {}
    if ctx.is_main:
        lm = build_model(config, tokenizer, ctx.device, on_host=True)
        weights = {f"lm.{k}": v for k, v in lm.state_dict().items()}
    distributed.wait_for_rank0(ctx)  # reading a large base model may outlast the collective timeout
    distributed.load_full_state(model, weights, ctx)
    torch.set_rng_state(distributed.broadcast_object(torch.get_rng_state(), ctx))


@dataclass
class _Run:
    """What the steps and saves of a run work on, built once by _train."""

    config: TrainConfig
    ctx: distributed.DistContext
    run_dir: Path
    tokenizer: Any
    stream: WindowStream
    model: MaskedLMLoss
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    meta_base: dict  # what every checkpoint's meta.json holds besides its step and token count


def _train(
    config: TrainConfig, ctx: distributed.DistContext, *, resume: bool, show_progress: bool, held: ExitStack
) -> Path:
    check_inputs(config)
    run_dir = config.run_dir()
    _refuse_unusable_run_dir(run_dir)
    _check_batch_split(config, ctx)
    distributed.open_io_group(ctx, config.checkpoint.io_timeout_minutes)
    point = _resume_point(run_dir, config, resume, ctx)
    metrics = _metrics_to_keep(run_dir / METRICS, point["step"] if point else 0)
    # The data is read whole (and checked) before the model is built: a bad file costs no model.
    source = open_source(config.data, config.seed, config.seq_len)
    if ctx.is_main:  # one process trains a run directory at a time; taken once every input is checked
        held.enter_context(output_lock(run_dir))
    tokenizer = recipe_tokenizer(config)
    source, stream = build_stream(config, tokenizer, source)
    model, optimizer, scheduler = build_training(config, tokenizer, ctx, initial_weights=point is None)
    step, tokens_seen = _restore(point, model, optimizer, scheduler, stream, ctx)
    _prepare_run_dir(run_dir, metrics, ctx)
    if ctx.is_main:
        print(f"attention: evalkit's {_attention_name(model)} implementation, {config.dtype}", file=sys.stderr)
        if config.paradigm.has_anchor:  # anchor, anchor_tag, anchor_interleaved
            print(anchor_note(tokenizer), file=sys.stderr)
    meta_base = _checkpoint_meta(config, model, tokenizer, source, ctx)
    run = _Run(config, ctx, run_dir, tokenizer, stream, model, optimizer, scheduler, meta_base)
    try:
        _train_steps(run, step, tokens_seen, show_progress)
    except OSError as err:  # files.naming made every full disk an OSError naming its file
        if disk_full_error(err) is None:
            raise
        raise _resume_after_full_disk(err, run_dir) from None
    return run_dir


def _resume_after_full_disk(err: OSError, run_dir: Path) -> UserError:
    newest = ckpt.complete_checkpoints(run_dir)[-1:]
    kept = f"from {newest[0][1].name}, the newest checkpoint" if newest else "from step 0: no checkpoint was saved"
    return UserError(
        f"no space left on the device writing {err.filename}: no partial checkpoint is left; free some space "
        f"there and add --resume to continue exactly {kept}"
    )


def _refuse_unusable_run_dir(run_dir: Path) -> None:
    """A file, a path under a file, an unwritable place, or another trainer's run: refused now, not
    at the first save. The log is rewritten on start and step-N directories replaced on save: never
    a file of the user's."""
    check_output_dir(run_dir)
    steps = [path for path in run_dir.glob("step-*") if ckpt.STEP_DIR.match(path.name)]
    ckpt.refuse_foreign_log(run_dir / METRICS)  # by the run's marker: other trainers log {"step", "loss"} too
    refuse_foreign(sorted(steps))


def _check_batch_split(config: TrainConfig, ctx: distributed.DistContext) -> None:
    per_process, remainder = divmod(config.windows_per_step, ctx.world_size)
    if remainder or per_process % config.micro_batch:
        raise UserError(
            f"windows_per_step={config.windows_per_step} must divide into {ctx.world_size} processes "
            f"x micro_batch={config.micro_batch}"
        )


def _restore(state: dict | None, model, optimizer, scheduler, stream, ctx) -> tuple[int, int]:
    """(step, tokens seen) to continue from: 0 and 0, or the resume point's, its state loaded."""
    if state is None:
        return 0, 0
    weights = {f"lm.{k}": v for k, v in state.get(ckpt.MASTER_WEIGHTS, {}).items()}
    distributed.load_full_state(model, weights, ctx, optimizer, state.get("optimizer", {}))
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    torch.set_rng_state(state["rng"])
    return state["step"], state["tokens_seen"]


def _prepare_run_dir(run_dir: Path, metrics: list[str], ctx: distributed.DistContext) -> None:
    """The run directory marked as this trainer's, a killed save's leftovers removed and the log
    cut to the steps kept (rank 0); every rank waits for it."""
    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt.mark_run(run_dir)
        ckpt.remove_partial(run_dir)
        if (run_dir / METRICS).is_file():
            atomic_write_text(run_dir / METRICS, "".join(line + "\n" for line in metrics))
    distributed.wait_for_rank0(ctx)


def _attention_name(model: MaskedLMLoss) -> str:
    implementation = model.lm.config._attn_implementation
    return HF_NAMES.get(implementation, implementation)


def _checkpoint_meta(config: TrainConfig, model: MaskedLMLoss, tokenizer, source, ctx) -> dict:
    return {
        "paradigm": config.paradigm.value,
        **({"anchor_token": anchor_record(tokenizer)} if config.paradigm.has_anchor else {}),
        # the attention trained: each layer's window as the saved config declares it, and the anchor's reading
        "attention": {
            "implementation": _attention_name(model),
            "layer_windows": layer_windows(model.lm.config),
            "window_anchor": config.model.window_anchor,
        },
        "config": config.to_dict(),
        **base_model_record(config),  # model.path as a hub name: the commit it resolved to
        # the precision of training, stated apart from the config: what the leaderboard shows
        "precision": regime.record(config.dtype, config.rope_precision, config.grad_accum_dtype),
        "data_fingerprint": data_fingerprint(source, config.data.window_start),
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "evalkit_version": evalkit.__version__,
        "git_hash": git_state()[0],
        "world_size": ctx.world_size,
    }


def _train_steps(run: _Run, step: int, tokens_seen: int, show_progress: bool) -> None:
    config, ctx = run.config, run.ctx
    save_steps = config.checkpoint_steps()
    autocast = autocast_context(config, ctx.device)
    bar, task = _progress_bar(show_progress and ctx.is_main, run.run_dir.name, config.max_steps, step)
    tokens_per_step = config.windows_per_step * config.seq_len
    with bar:
        while step < config.max_steps:
            started = time.perf_counter()
            windows = [run.stream.next_window() for _ in range(config.windows_per_step)]
            data_s = time.perf_counter() - started
            loss, step_s = _timed_step(run.model, run.optimizer, run.scheduler, windows, config, ctx, autocast)
            step += 1
            tokens_seen += tokens_per_step
            tokens_per_s = tokens_per_step / step_s  # the model's speed, not packing's
            record = {"step": step, "loss": loss, "lr": run.scheduler.get_last_lr()[0], "tokens_per_s": tokens_per_s}
            record |= {"step_s": step_s, "data_s": data_s, "tokens_seen": tokens_seen}
            if ctx.is_main:  # one line of the metrics log (a step is logged before it is saved)
                with naming(run.run_dir / METRICS), (run.run_dir / METRICS).open("a") as log:
                    log.write(json.dumps(record) + "\n")
            bar.update(task, completed=step, loss=loss, tps=tokens_per_s)
            if step in save_steps or step % config.checkpoint.every == 0:
                _save(run, step, tokens_seen)


def _timed_step(model, optimizer, scheduler, windows, config: TrainConfig, ctx, autocast) -> tuple[float, float]:
    """(loss, seconds of compute): the optimizer step timed alone, from a synchronised start to a
    synchronised end, so that building the windows (data_s) never counts as the model's time."""
    _synchronize(ctx.device)
    started = time.perf_counter()
    step = scheduler.last_epoch + 1  # the steps taken, and this one
    loss = optimizer_step(model, optimizer, windows, config, ctx, autocast, step=step)
    scheduler.step()
    _synchronize(ctx.device)
    return loss, time.perf_counter() - started


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _resume_point(run_dir: Path, config: TrainConfig, resume: bool, ctx: distributed.DistContext) -> dict | None:
    """The trainer state --resume continues from (ckpt.load_trainer_state), checked and read whole
    before any work starts; None to start at 0. Distributed, rank 0 alone reads; the others
    receive the small part (step, scheduler, data position, RNG) or rank 0's error, and the weights
    and optimizer state by broadcast later."""
    if not ctx.distributed:
        return _read_resume_point(run_dir, config, resume)
    state, error = None, None
    if ctx.is_main:
        try:
            state = _read_resume_point(run_dir, config, resume)
        except UserError as err:
            error = str(err)
    small = None if state is None else {k: v for k, v in state.items() if k not in _RANK0_ONLY}
    error, small = distributed.broadcast_object((error, small), ctx)
    if error is not None:
        raise UserError(error)
    return state if ctx.is_main else small


_RANK0_ONLY = ("optimizer", ckpt.MASTER_WEIGHTS)  # the trainer state's large parts: read by rank 0 alone


def _read_resume_point(run_dir: Path, config: TrainConfig, resume: bool) -> dict | None:
    if not resume and ckpt.complete_checkpoints(run_dir):
        raise UserError(f"{run_dir} already has checkpoints; pass --resume to continue it or choose another --out")
    resume_from = ckpt.newest_resumable(run_dir) if resume else None
    if resume_from is None:
        if resume:
            print(f"no checkpoint to resume in {run_dir}; starting from step 0", file=sys.stderr)
        return None
    meta = _read_meta(resume_from)
    _check_resume_config(meta.get("config", {}), config)
    check_checkpoint(resume_from, trust_remote_code=True)  # a truncated model.safetensors: one line, not a traceback
    return ckpt.load_trainer_state(resume_from)


def _read_meta(checkpoint: Path) -> dict:
    path = checkpoint / ckpt.META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(
            f"cannot read {path} ({err}); move {checkpoint} aside to resume from the checkpoint before it"
        ) from None
    if not isinstance(meta, dict):
        raise UserError(f"{path} is not a JSON object; move {checkpoint} aside to resume from the checkpoint before it")
    return meta


def _save(run: _Run, step: int, tokens_seen: int) -> None:
    """Gather the full state to rank 0, which checks and writes it while the others wait in the I/O
    group (no collective of the training group is pending meanwhile, so its timeout cannot fire).
    Its failure (non-finite weights, a full disk) reaches every rank: all stop with it."""
    model, optimizer, ctx = run.model, run.optimizer, run.ctx
    model_state, optimizer_state = distributed.full_state(model, optimizer, ctx)
    failure = None
    if ctx.is_main:
        try:
            _write_checkpoint(run, step, tokens_seen, model_state, optimizer_state)
        except (UserError, OSError) as err:
            failure = err
    failure = distributed.broadcast_object(failure, ctx)  # also every rank's wait for rank 0
    if failure is not None:
        raise failure


def _write_checkpoint(run: _Run, step: int, tokens_seen: int, model_state: dict, optimizer_state: dict) -> None:
    """step-<step> written from the gathered state (rank 0), then older checkpoints pruned; never
    non-finite weights (an update can overflow them although its gradients were finite)."""
    config = run.config
    if not all(bool(v.isfinite().all()) for v in model_state.values() if v.is_floating_point()):
        raise _diverged(step, "its update made weights non-finite")
    trainer_state = {
        "step": step,
        "tokens_seen": tokens_seen,
        "optimizer": optimizer_state,
        "scheduler": run.scheduler.state_dict(),
        "stream": run.stream.state_dict(),
        "rng": torch.get_rng_state(),
    }
    meta = {"step": step, "tokens_seen": tokens_seen, **run.meta_base}
    weights = {k.removeprefix("lm."): v for k, v in model_state.items()}
    weights_dtype = torch.bfloat16 if config.dtype in regime.BF16_DTYPES else torch.float32
    ckpt.write_checkpoint(
        run.run_dir, step, run.model.lm, run.tokenizer, weights, trainer_state, meta, weights_dtype=weights_dtype
    )
    ckpt.prune(run.run_dir, config.checkpoint_steps(), config.checkpoint.keep_periodic)
