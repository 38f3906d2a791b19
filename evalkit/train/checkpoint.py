"""Checkpoints: plain HF directories `runs/<run>/step-<N>/` (docs/training.md), assembled in a hidden
temporary directory, meta.json last, and renamed into place: a step-N with a meta.json is complete,
whatever moment a run was killed at. Only the newest holds trainer_state.pt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from evalkit.errors import UserError
from evalkit.files import (
    atomic_write_json,
    check_replaceable,
    move_into_place,
    naming,
    new_directory_beside,
    read_json_object,
)
from evalkit.models.check import HubModel, check_checkpoint, checkpoint_source
from evalkit.models.refs import META, STEP_DIR, step_dir_name
from evalkit.store.provenance import stamp

TRAINER_STATE = "trainer_state.pt"
MASTER_WEIGHTS = "master_weights"  # trainer_state key: the fp32 weights when model.safetensors is bf16


RUN_MARKER = "evalkit-run.json"  # in a run directory: evalkit's trainer made it (its log is evalkit's)


def mark_run(run_dir: Path) -> None:
    """Say that evalkit trains this run directory, once, when it starts: what makes its metrics log
    evalkit's to rewrite (a resume truncates it), whatever other trainers' logs look like."""
    marker = Path(run_dir) / RUN_MARKER
    if not marker.exists():
        atomic_write_json(marker, {"written_by": "evalkit", "schema_version": 1, "provenance": stamp()})


def is_evalkit_run(run_dir: Path) -> bool:
    """A run directory evalkit's trainer made: its marker, or (runs from before the marker) a
    checkpoint whose meta.json evalkit's trainer wrote (it records evalkit_version)."""
    if read_json_object(Path(run_dir) / RUN_MARKER).get("written_by") == "evalkit":
        return True
    metas = (read_json_object(path / META) for _step, path in complete_checkpoints(run_dir))
    return any("evalkit_version" in meta and "step" in meta for meta in metas)


def refuse_foreign_log(log: Path) -> None:
    """Before any work: a metrics log in a run directory evalkit did not make is another trainer's
    (or the user's), never truncated or rewritten."""
    if log.exists() and not is_evalkit_run(log.parent):
        raise UserError(
            f"{log} is in the way and was not written by evalkit (its directory has no {RUN_MARKER} nor an "
            "evalkit checkpoint); evalkit never replaces or truncates a file it did not write: move it away, or "
            "choose another --out (an evalkit run that saved no checkpoint yet: delete it and start again)"
        )


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for child in Path(run_dir).glob("step-*"):  # none when run_dir is no directory
        match = STEP_DIR.match(child.name)
        if match and child.is_dir() and (child / META).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def newest_resumable(run_dir: Path) -> Path | None:
    """The checkpoint --resume continues from: the newest complete one, which must hold its trainer
    state; None when there is none (step 0). Never an older one silently, nor step 0 over existing
    checkpoints: either would train over, and prune, newer ones this run did not write (an export, a
    copy without its trainer state, a user's own step-N): refused, saying what to do."""
    checkpoints = complete_checkpoints(run_dir)
    if not checkpoints:
        return None
    newest = checkpoints[-1][1]
    if (newest / TRAINER_STATE).is_file():
        return newest
    older = [path for _step, path in checkpoints[:-1] if (path / TRAINER_STATE).is_file()]
    fix = (
        f"move {newest} aside to resume from {older[-1]}"
        if older
        else f"start a new run from its weights with --set model.path={newest} and another --out"
    )
    raise UserError(
        f"cannot resume {run_dir}: its newest checkpoint {newest} has no {TRAINER_STATE} (the optimizer, "
        f"data position and RNG needed to continue exactly); restore that file, or {fix}; nothing was changed"
    )


def remove_partial(run_dir: Path) -> None:
    """Remove the temporary directories left by a run killed while saving."""
    for child in Path(run_dir).glob(".step-*.tmp"):
        shutil.rmtree(child, ignore_errors=True)


def write_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    model_state: dict[str, torch.Tensor],
    trainer_state: dict,
    meta: dict,
    *,
    weights_dtype: torch.dtype = torch.float32,
) -> Path:
    """Write step-<step> atomically (rank 0 only); returns its path. model.safetensors is in
    `weights_dtype`; when that is not fp32 the fp32 weights go into the trainer state. A failure
    (a full disk, Ctrl-C) leaves no temporary; a kill's is removed by the next start (remove_partial)."""
    final = Path(run_dir) / step_dir_name(step)
    tmp = Path(run_dir) / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = dict(model_state)
    if getattr(model.config, "tie_word_embeddings", False):
        head = model.get_output_embeddings()  # stored once, as the input embedding
        weights.pop(next((f"{name}.weight" for name, module in model.named_modules() if module is head), ""), None)
    if weights_dtype != torch.float32:
        trainer_state = {**trainer_state, MASTER_WEIGHTS: weights}
    try:
        with naming(tmp):  # a full disk: an OSError naming where, whichever library was writing
            _write_files(tmp, model, tokenizer, weights, trainer_state, meta, weights_dtype)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def _write_files(tmp: Path, model, tokenizer, weights: dict, trainer_state: dict, meta: dict, dtype: torch.dtype):
    with naming(tmp / "model.safetensors"):
        _write_weights(tmp, weights, dtype)
    model.config.save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text())
    config.pop("_attn_implementation_autoset", None)
    config.pop("attn_implementation", None)  # readers choose their own; evalkit's needs registering
    _write_config(tmp, config, dtype)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # Through a Python file: on a full disk torch's own writer fails with "unexpected pos" and no
    # errno; this way the ENOSPC of the file's write is in the error's chain (files.disk_full_error).
    with naming(tmp / TRAINER_STATE), (tmp / TRAINER_STATE).open("wb") as file:
        torch.save(trainer_state, file)
    atomic_write_json(tmp / META, meta)  # last: its presence marks the checkpoint complete


def _write_weights(folder: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """folder/model.safetensors: the floating tensors cast to `dtype`, the others as they are."""
    from safetensors.torch import save_file

    cast = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    save_file(cast, folder / "model.safetensors", metadata={"format": "pt"})


def _write_config(folder: Path, config: dict, dtype: torch.dtype) -> None:
    """folder/config.json stating the weights' dtype (under its current key, not torch_dtype)."""
    config["dtype"] = str(dtype).removeprefix("torch.")
    config.pop("torch_dtype", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_trainer_state(path: Path) -> dict:
    """The trainer state to resume from, its MASTER_WEIGHTS the fp32 weights: the master copy a bf16
    checkpoint stores there, else model.safetensors (fp32 checkpoints, and every checkpoint written
    before bf16 ones existed)."""
    try:
        state = torch.load(Path(path) / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as err:
        raise UserError(f"cannot read the trainer state in {path}: {str(err).splitlines()[0]}") from None
    if state.get(MASTER_WEIGHTS) is None:
        state[MASTER_WEIGHTS] = load_model_state(path)
    return state


def load_model_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    file = Path(path) / "model.safetensors"
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise UserError(f"cannot read {file} ({err}): it is missing, truncated or corrupt; copy it again") from None


def prune(run_dir: Path, keep_steps: set[int], keep_periodic: bool) -> None:
    """After a save: only the newest checkpoint keeps its trainer state; resume-only checkpoints
    outside the evaluation window go unless asked to keep them."""
    checkpoints = complete_checkpoints(run_dir)
    for step, path in checkpoints[:-1]:
        if step not in keep_steps and not keep_periodic:
            shutil.rmtree(path, ignore_errors=True)
        else:
            (path / TRAINER_STATE).unlink(missing_ok=True)


def export_checkpoint(
    source: str | Path, destination: Path, dtype: torch.dtype = torch.bfloat16, *, overwrite: bool = False
) -> Path:
    """A checkpoint to ship or share: its weights cast to `dtype`, without the trainer state, the rest
    copied as it is (config.json's dtype updated). A hub name's snapshot (no meta.json of its own)
    gets one recording its repo, revision and commit."""
    (source, hub), destination = checkpoint_source(str(source)), Path(destination)
    if not (source / META).is_file() and hub is None:
        raise UserError(f"{source} is not a complete checkpoint (no {META})")
    if destination.is_dir() and destination.resolve() == source.resolve():
        raise UserError(f"{destination} is the checkpoint being exported; give another directory")
    check_replaceable(destination, lambda path: (path / META).is_file(), "an evalkit checkpoint", overwrite)
    # The checks every loader makes (config.json, whole safetensors), before anything is written;
    # trust_remote_code=True since an export runs no model code, custom or not.
    config = check_checkpoint(source, trust_remote_code=True)
    tmp = new_directory_beside(destination)  # a fresh name: nothing of the user's can be in it
    try:
        _write_export(source, tmp, config, dtype, hub)
        move_into_place(tmp, destination)
    except BaseException:  # an error, a Ctrl-C: no hidden half-copy is left beside the destination
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return destination


def _write_export(source: Path, tmp: Path, config: dict, dtype: torch.dtype, hub: HubModel | None) -> None:
    for item in source.iterdir():
        if item.name in ("model.safetensors", TRAINER_STATE, META) or item.is_dir():
            continue
        shutil.copy2(item, tmp / item.name)
    _write_weights(tmp, load_model_state(source), dtype)
    _write_config(tmp, config, dtype)
    if hub is not None:  # last, as when it was written
        atomic_write_json(tmp / META, {"hub": hub.record()})
    else:
        shutil.copy2(source / META, tmp / META)
