"""`evalkit quickstart`: the whole study end to end on a CPU, offline.

    1. train    the recipe (--recipe, default tiny-long) under each paradigm, a short run each
                (resumed, or reused when finished)
    2. ruler    the last checkpoints of each run at the training length and twice it, on the
                tasks whose data is built in (qa_1/qa_2 need downloads and are left out); beside
                them the recipe's shipped runs (checkpoints/<recipe>/), trained to the end by
                `evalkit train` on this kind of CPU, which the quickstart's budget cannot do
    3. general  the offline fixture tasks of evalkit/tasks/
    4. board    leaderboard.md and plots from the stored results

Every stage stores what it made, so a second run reuses all of it and finishes in seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from evalkit.errors import UserError
from evalkit.results.leaderboard import check_leaderboard_outputs, write_leaderboard
from evalkit.storage import check_output_dir, output_lock

QUICK_RECIPE = "tiny-long"
QUICK_STEPS = 30  # the quickstart's own runs: training shown end to end in about a minute per paradigm
QUICK_PARADIGMS = ("full", "intra_doc", "anchor")
FIXTURE_TASKS = ("evalkit_fixture_mmlu_style", "evalkit_fixture_hellaswag_style")
BUILTIN_RULER_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)


@dataclass
class QuickstartPlan:
    recipe: str = QUICK_RECIPE
    paradigms: tuple[str, ...] = QUICK_PARADIGMS
    max_steps: int | None = QUICK_STEPS  # a short run per paradigm; None: the recipe's own
    shipped: bool = True  # also evaluate the recipe's shipped runs, when it has some
    sets: list[str] = field(default_factory=list)  # recipe overrides
    last: int = 2  # checkpoints per run evaluated and averaged
    samples: int = 10  # RULER samples per task and length
    lengths: list[int] | None = None  # None: the training length and twice it
    general_limit: int | None = None  # None: every fixture question
    runs_dir: Path = Path("runs/quickstart")
    out: Path = Path("results/quickstart")


def check_plan(plan: QuickstartPlan) -> None:
    """What the later stages would refuse only after training has run, refused before it."""
    from evalkit.results.checkpoints import check_last

    check_last(plan.last)
    counts = {"--samples": plan.samples, "--max-steps": plan.max_steps, "--general-limit": plan.general_limit}
    for option, value in counts.items():
        if value is not None and value < 1:
            raise UserError(f"{option} must be at least 1, got {value}")
    if plan.lengths is not None and (not plan.lengths or min(plan.lengths) < 1):
        raise UserError(f"--lengths must be positive token counts, got {plan.lengths}")
    check_output_dir(plan.out)
    check_leaderboard_outputs(plan.out / "leaderboard.md")  # replaced at the end: never a file of the user's
    check_output_dir(plan.runs_dir, "--runs")


def _stage(console: Console, number: int, title: str) -> float:
    console.rule(f"[bold]{number}. {title}")
    return time.perf_counter()


def train_runs(plan: QuickstartPlan, console: Console) -> list[Path]:
    """Each paradigm's run, trained to the end (resumed if interrupted, skipped if finished)."""
    from evalkit.train import load_config, train
    from evalkit.train.checkpoint import complete_checkpoints
    from evalkit.train.config import resolve_recipe

    runs = []
    name = resolve_recipe(plan.recipe).stem  # a recipe given as a path: its file's name
    spacing = _short_run_spacing(plan)
    for paradigm in plan.paradigms:
        run_dir = plan.runs_dir / f"{name}-{paradigm}"
        overrides = {"paradigm": paradigm, "max_steps": plan.max_steps, "out": str(run_dir), **spacing}
        config = load_config(plan.recipe, overrides, plan.sets)
        done = [step for step, _ in complete_checkpoints(config.run_dir())]
        if done and done[-1] >= config.max_steps:
            console.print(f"{paradigm}: finished earlier ({config.run_dir()}, step {done[-1]}), reused")
        else:
            console.print(
                f"{paradigm}: training {config.max_steps} steps of {config.windows_per_step} x {config.seq_len} tokens"
            )
            train(config, resume=True)
        runs.append(config.run_dir())
    return runs


def _short_run_spacing(plan: QuickstartPlan) -> dict[str, int]:
    """A shortened run still ends with the recipe's final_count checkpoints: their spacing shrinks to fit."""
    from evalkit.train import load_config

    if plan.max_steps is None:
        return {}
    checkpoint = load_config(plan.recipe, {}, plan.sets).checkpoint
    fitting = max(1, plan.max_steps // (2 * checkpoint.final_count))
    return {"checkpoint.final_spacing": fitting} if fitting < checkpoint.final_spacing else {}


def shipped_runs(recipe: str) -> list[Path]:
    """Runs shipped for a recipe: checkpoints/<name>/<run>/step-N beside the recipe's configs/ folder.

    For evalkit's own recipes that is evalkit/checkpoints/<recipe>/; a recipe of one's own
    at project/configs/x.yaml finds project/checkpoints/x/. Most recipes ship none.
    """
    from evalkit.results.checkpoints import STEP_DIR
    from evalkit.train.config import resolve_recipe

    path = resolve_recipe(recipe)
    folder = path.resolve().parent.parent / "checkpoints" / path.stem
    if not folder.is_dir():
        return []
    return sorted(
        run for run in folder.iterdir() if run.is_dir() and any(STEP_DIR.match(p.name) for p in run.iterdir())
    )


def run_quickstart(plan: QuickstartPlan, console: Console | None = None) -> Path:
    """All four stages; returns the leaderboard's path."""
    check_plan(plan)
    from evalkit.train import load_config

    console = console or Console(stderr=True)
    started = time.perf_counter()
    seq_len = load_config(plan.recipe, {"max_steps": plan.max_steps}, plan.sets).seq_len
    lengths = plan.lengths or [seq_len, 2 * seq_len]
    # One quickstart per --out: a second would train the same runs and write the same results at once.
    # out/ruler and out/general are held by the evaluation pipeline while it writes them.
    with output_lock(plan.out):
        return _run_stages(plan, console, lengths, started)


def _run_stages(plan: QuickstartPlan, console: Console, lengths: list[int], started: float) -> Path:
    t = _stage(console, 1, f"train {plan.recipe} under {', '.join(plan.paradigms)}")
    runs = train_runs(plan, console)
    console.print(f"[dim]{time.perf_counter() - t:.0f} s[/dim]")

    from evalkit.results.checkpoints import resolve_checkpoints

    shipped = shipped_runs(plan.recipe) if plan.shipped else []
    if shipped:
        console.print(
            f"also evaluated: the shipped runs {', '.join(run.name for run in shipped)} ({shipped[0].parent})"
        )
    refs = resolve_checkpoints([str(run) for run in runs + shipped], last=plan.last)
    t = _stage(console, 2, f"RULER at {', '.join(map(str, lengths))} tokens, {plan.samples} samples per task")
    _ruler(refs, lengths, plan, console)
    console.print(f"[dim]{time.perf_counter() - t:.0f} s[/dim]")

    t = _stage(console, 3, "general tasks (offline fixtures)")
    _general(refs, plan, console)
    console.print(f"[dim]{time.perf_counter() - t:.0f} s[/dim]")

    t = _stage(console, 4, "leaderboard")
    board = write_leaderboard([plan.out / "ruler", plan.out / "general"], plan.out / "leaderboard.md")
    print(board.read_text(), flush=True)  # plain stdout: markdown, not rich markup
    console.print(f"done in {time.perf_counter() - started:.0f} s: {board} and plots in {board.parent / 'plots'}")
    return board


def _ruler(refs, lengths: list[int], plan: QuickstartPlan, console: Console) -> None:
    from evalkit.ruler.runner import RulerSettings, run_ruler

    settings = RulerSettings(tasks=list(BUILTIN_RULER_TASKS), lengths=lengths, num_samples=plan.samples)
    last_shown = {}

    def progress(task: str, length: int, done: int, total: int) -> None:
        if done == total and last_shown.get((task, length)) != total:
            console.print(f"[dim]  {task} @ {length}: {total} samples[/dim]")
        last_shown[(task, length)] = done

    run = run_ruler(
        refs,
        settings,
        plan.out / "ruler",
        progress=progress,
        on_checkpoint=lambda ref: console.print(f"{ref.run} step {ref.step}"),
    )
    for skip in {(s["task"], s["length"], s["reason"]) for s in run.skipped}:  # once, not per checkpoint
        console.print(f"[yellow]skipped[/yellow] {skip[0]} @ {skip[1]}: {skip[2]}")


def _general(refs, plan: QuickstartPlan, console: Console) -> None:
    from evalkit.general import run_general

    run = run_general(
        refs,
        list(FIXTURE_TASKS),
        out=plan.out / "general",
        limit=plan.general_limit,
        on_checkpoint=lambda ref: console.print(f"{ref.run} step {ref.step}"),
        log=console.print,
    )
    if not run.rows:
        raise UserError("the general-task fixtures produced no score; see the messages above")
