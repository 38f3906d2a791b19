"""The evalkit command as a user meets it: help, errors; and the attention benchmark's program."""

import subprocess
import sys
from pathlib import Path

import pytest

from perf import attention as bench

EVALKIT = [sys.executable, "-m", "evalkit.cli"]
ROOT = Path(__file__).resolve().parents[1]
PERF = [sys.executable, "-m", "perf"]  # run from the repository's root


def run_cli(*args, **kwargs):
    return subprocess.run([*EVALKIT, *args], capture_output=True, text=True, timeout=300, **kwargs)


def test_help_lists_every_command_without_importing_heavy_optionals():
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from evalkit.cli import app\n"
        "result = CliRunner().invoke(app, ['--help'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(result.output)\n"
        "print('HEAVY', [m for m in ('vllm', 'flash_attn', 'lm_eval', 'transformers') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for command in (
        "train",
        "export",
        "ruler",
        "general",
        "ppl",
        "probe",
        "leaderboard",
        "compare",
        "quickstart",
    ):
        assert command in out.stdout
    assert "HEAVY []" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seq", "12q"], "could not read length '12q'"),
        (["--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["--paradigms", "anchr"], "unknown paradigm 'anchr'"),
        (["--paradigms", "full"], "full is the baseline"),
        (["--impls", "flex"], "cannot run forward+backward on cpu"),
        (["--device", "cpux"], "--device must be cpu or cuda, got 'cpux'"),
    ],
)
def test_bad_bench_input_is_one_line_error(args, message):
    result = subprocess.run([*PERF, "attention", *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bench_attention_writes_a_report(tmp_path):
    out = tmp_path / "bench.md"
    result = subprocess.run([*PERF, "attention", "--seq", "256", "--repeats", "1", "--mean-doc", "64",
                             "--paradigms", "intra_doc,anchor", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "Command: `python -m perf attention --seq 256" in text
    assert "B=1, H=8, Hkv=8, D=64, fp32" in text
    rows = [line for line in text.splitlines() if line.startswith("| 256 |")]
    assert [r.split("|")[2:4] for r in rows] == [
        [" full ", " sdpa-causal "],
        [" intra_doc ", " dense "],
        [" intra_doc ", " blocked "],
        [" anchor ", " dense "],
        [" anchor ", " blocked "],
    ]


def test_bench_ideal_ratio_is_sum_of_squared_document_lengths():
    rows = bench.run([128], mean_doc=16, repeats=1, impls=["blocked"], paradigms=None)
    from evalkit.attention import pack

    docs = bench.draw_documents(128, 16, seed=0)
    for row in rows[1:]:
        tags = [7] * len(docs) if row.paradigm == "anchor_tag" else None
        packed = pack(docs, 128, row.paradigm, bos_id=1, eos_id=2, domain_tags=tags)
        lengths = packed.doc_lengths
        assert sum(lengths) == 128 - (1 if packed.paradigm.has_anchor else 0)  # documents fill the window
        assert row.ideal_ratio == pytest.approx(sum(n * n for n in lengths) / 128**2)
        assert row.ratio_to_full == pytest.approx(row.seconds / rows[0].seconds)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "no-such-recipe"], "no config 'no-such-recipe'"),
        (["--set", "optim.lrr=1"], "unknown config key 'optim.lrr'"),
        (["--paradigm", "anchr"], "unknown paradigm 'anchr'"),
        (["--model", "./no/such/model", "--max-steps", "1"], "model path ./no/such/model does not exist"),
        (["--set", "data.source=/no/such.jsonl"], "data file /no/such.jsonl does not exist"),
        (["--set", "model=3", "--set", "model.path=x"], "model.path: model is set to a value above, not a section"),
    ],
)
def test_bad_train_input_is_one_line_error(args, message, tmp_path):
    result = run_cli("train", "--out", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing written before the error


@pytest.mark.parametrize(
    "args, message",
    [
        (["shift", "--ckpt", "/no/such/ckpt"], "no checkpoint directory at /no/such/ckpt"),
        (["tokens", "--ckpt", "."], "has no config.json"),
    ],
)
def test_bad_probe_input_is_one_line_error(args, message):
    result = run_cli("probe", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [["ruler"], ["general"], ["ppl"], ["train"], ["export"], ["quickstart"], ["probe", "tokens"]],
)
def test_help_shows_the_hub_revision_suffix(command):
    # Rich reads "[@revision]" as markup and drops it unless escaped: the help must say what the README says.
    from typer.testing import CliRunner

    from evalkit.cli import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "org/name" in result.output
    assert "org/name[@revision]" in result.output
