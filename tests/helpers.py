"""The test suite's one tiny-checkpoint builder and its independent references.

The builder makes small random models from a config (never downloaded), saved with a tokenizer
as `evalkit train` saves a checkpoint. The references compute what evalkit must return the slow,
plain way: full unpadded forwards of the model, no KV cache, no batching, no engine, masks
written out by hand, attention in float64. Conftests hold fixtures only; tests import these from
here (scripts/gpu_vllm_check.py too). At the end, the CLI as a user meets it (exit status, one
`error:` line, no traceback, what is left on disk) and the shipped tiny-base broken on purpose.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch

# evalkit's trainer builds these architectures; the engines serve each.
ARCHITECTURES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
TINY_WINDOW = 128  # max_position_embeddings unless a test asks for more
TINY_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, head dim 16
)


def tiny_config(tokenizer=None, architecture: str = "llama", **changes):
    """A 2-layer config of TINY_SHAPE; with a tokenizer, its vocabulary and special-token ids.

    initializer_range 0.2 by default: spread-out logits, so greedy and argmax choices are clear,
    not near-ties. `changes` set (or, with None, unset) any config field.
    """
    import transformers

    settings = dict(TINY_SHAPE, max_position_embeddings=TINY_WINDOW, initializer_range=0.2, attention_dropout=0.0)
    if tokenizer is not None:
        settings.update(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if architecture != "llama":
        settings["sliding_window"] = None  # as evalkit's trainer saves Qwen2 and Mistral models
    settings.update(changes)
    return getattr(transformers, f"{ARCHITECTURES[architecture]}Config")(**settings)


def build_checkpoint(directory: Path, tokenizer, architecture: str = "llama", seed: int = 0, **changes):
    """Save a tiny random model (seeded) and the tokenizer to `directory`; return the model (eval mode)."""
    import transformers

    torch.manual_seed(seed)
    config = tiny_config(tokenizer, architecture, **changes)
    model = getattr(transformers, f"{ARCHITECTURES[architecture]}ForCausalLM")(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


def copy_with_config(source: Path, destination: Path, **changes) -> Path:
    """A copy of a checkpoint with some config.json fields changed."""
    shutil.copytree(source, destination)
    config = json.loads((destination / "config.json").read_text())
    config.update(changes)
    (destination / "config.json").write_text(json.dumps(config))
    generation_config = destination / "generation_config.json"
    if generation_config.exists():
        generation_config.unlink()  # it would carry the old eos_token_id
    return destination


@torch.no_grad()
def full_logits(model, ids: list[int], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [S, V] of one unpadded forward at positions 0..S-1 (mask: bool [S, S], True = may attend)."""
    input_ids = torch.tensor([ids])
    positions = torch.arange(len(ids))[None]
    attention_mask = None if mask is None else mask[None, None]
    return model(input_ids=input_ids, position_ids=positions, attention_mask=attention_mask).logits[0]


def greedy_without_cache(model, ids: list[int], max_new_tokens: int, eos_ids: set[int], mask_for=None) -> list[int]:
    """Greedy decoding the slow way: the whole sequence re-run for every token, no KV cache.

    mask_for(n) gives the attention mask of an n-token sequence (None: plain causal).
    """
    sequence, generated = list(ids), []
    for _ in range(max_new_tokens):
        mask = None if mask_for is None else mask_for(len(sequence))
        token = int(full_logits(model, sequence, mask)[-1].argmax())
        if token in eos_ids:
            break
        generated.append(token)
        sequence.append(token)
    return generated


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@torch.no_grad()
def direct_logprob(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """(sum_t log p(continuation_t | all before it), every continuation token the argmax): one unpadded forward."""
    ids = context + continuation
    logits = model(input_ids=torch.tensor([ids]), position_ids=torch.arange(len(ids))[None]).logits[0]
    logprobs = logits.double().log_softmax(-1)
    positions = range(len(context) - 1, len(ids) - 1)
    total = sum(float(logprobs[p, token]) for p, token in zip(positions, continuation, strict=True))
    greedy = all(int(logprobs[p].argmax()) == token for p, token in zip(positions, continuation, strict=True))
    return total, greedy


def naive_attention(q, k, v, mask, scale=None):
    """Textbook attention in float64 with an explicit bool mask [B, Sq, Sk] (GQA by repetition)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", scores.softmax(-1), v)


BOS, EOS = 1, 2  # the special ids random_pack packs with


def random_pack(paradigm, seq_len: int, seed: int):
    """A window of random documents (lengths 1..seq_len/2, last one cut), tags when needed."""
    from evalkit.attention import pack

    rng = random.Random(seed)
    docs, total = [], 0
    while total < seq_len + 8:  # more than fits: the last document is cut
        n = rng.randint(1, max(2, seq_len // 2))
        docs.append([rng.randint(10, 90) for _ in range(n)])
        total += n + 2
    tags = [rng.randint(91, 99) for _ in docs] if paradigm.uses_tags else None
    return pack(docs, seq_len, paradigm, bos_id=BOS, eos_id=EOS, domain_tags=tags, seed=seed)


def exact_length(tokenizer, sample) -> int:
    """What the engine feeds a RULER sample for a base model: input + answer prefix, special tokens added."""
    return len(tokenizer(sample.input + sample.answer_prefix)["input_ids"])


PROBE_VOCAB = 256


def probe_config(architecture: str = "llama", **changes):
    """The probe's tiny models: vocabulary 256, window 256, peakier attention than the 0.02
    default (initializer_range 0.05) so that BF16's errors show clearly."""
    settings = dict(vocab_size=PROBE_VOCAB, max_position_embeddings=256, initializer_range=0.05)
    return tiny_config(None, architecture, **{**settings, **changes})


def probe_model(config, dtype: torch.dtype, seed: int = 0):
    """A base model (no LM head) with the probe attention: the same seeded weights in any dtype,
    built in that dtype (as loading a checkpoint does: a cast with .to() would also round RoPE's
    inverse frequencies, which transformers keeps in FP32)."""
    from transformers import AutoModel

    from evalkit.probe import PROBE_ATTENTION, register_probe_attention

    register_probe_attention()
    torch.manual_seed(seed)
    weights = AutoModel.from_config(config, dtype=torch.float32).state_dict()
    model = AutoModel.from_config(config, dtype=dtype, attn_implementation=PROBE_ATTENTION).eval()
    model.load_state_dict(weights)
    return model


def run_cli(args: list[str]) -> int:
    """evalkit's entry point in this process (a subprocess would re-import torch): its exit status."""
    import sys

    from evalkit import cli

    old = sys.argv
    sys.argv = ["evalkit", *args]
    try:
        cli.main()
    except SystemExit as exit_:
        return int(exit_.code or 0)
    finally:
        sys.argv = old
    return 0


def write_qa_files(folder: Path) -> Path:
    """Tiny SQuAD v2 dev and HotpotQA dev-distractor files in the real formats (RULER's qa_1 and
    qa_2 datasets), written into `folder` from offline prose."""
    import re

    from evalkit.corpus import prose_documents

    docs = [re.sub(r"\s+", " ", doc)[:500] for doc in prose_documents()[:200]]
    articles = []
    for a in range(20):
        paragraphs = []
        for p in range(4):
            context = docs[a * 4 + p]
            answer = context.split()[5]
            answers = [{"text": answer, "answer_start": context.index(answer)}, {"text": answer, "answer_start": 0}]
            unanswerable = {"text": "nothing", "answer_start": 0}
            qas = [
                {
                    "id": f"{a}-{p}",
                    "question": f"Which word is sixth in {a}-{p}?",
                    "is_impossible": False,
                    "answers": answers,
                },
                {
                    "id": f"{a}-{p}-x",
                    "question": f"Unanswerable {a}-{p}?",
                    "is_impossible": True,
                    "answers": [],
                    "plausible_answers": [unanswerable],
                },
            ]
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Article {a}", "paragraphs": paragraphs})
    (folder / "dev-v2.0.json").write_text(json.dumps({"version": "v2.0", "data": articles}))
    hotpot = []
    for q in range(30):
        context = [
            [f"Title {q}-{j}", [s + ". " for s in docs[80 + (q * 7 + j) % 120][:240].split(". ")]] for j in range(10)
        ]
        hotpot.append(
            {
                "_id": f"h{q}",
                "question": f"Is title {q}-0 first?",
                "answer": f"yes {q}",
                "type": "comparison",
                "level": "easy",
                "supporting_facts": [[context[0][0], 0]],
                "context": context,
            }
        )
    (folder / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpot))
    return folder


# ---------------------------------------------------------------------- the CLI as a user meets it

ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = ROOT / "evalkit" / "checkpoints" / "tiny-base"  # an evalkit checkpoint with tied embeddings
EVALKIT = [sys.executable, "-m", "evalkit.cli"]


def evalkit(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`evalkit ARGS` in a subprocess. The timeout only stops a hung process; no assertion depends on time."""
    return subprocess.run(
        [*EVALKIT, *map(str, args)], check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def evalkit_here(capsys, *args: str | Path) -> subprocess.CompletedProcess:
    """`evalkit ARGS` through the CLI's entry point in this process (no interpreter and torch start
    per case), seen as a subprocess would be: exit status and stderr."""
    import signal

    from evalkit.cli import main

    handler = signal.getsignal(signal.SIGTERM)
    capsys.readouterr()
    old_argv, sys.argv = sys.argv, ["evalkit", *map(str, args)]
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = old_argv
        signal.signal(signal.SIGTERM, handler)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused command (asserting that it was refused that way)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def hidden_entries(directory: Path) -> list[str]:
    """Dot-files and dot-directories: where a temporary copy would be left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its content's digest: to show that nothing was touched."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def copy_tiny_base(destination: Path) -> Path:
    shutil.copytree(TINY_BASE, destination)
    return destination


def edit_json(path: Path, change: Callable[[dict], dict]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def edit_config(checkpoint: Path, **changes) -> None:
    edit_json(checkpoint / "config.json", lambda config: {**config, **changes})


def edit_weights(checkpoint: Path, change: Callable[[dict], dict]) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint / "model.safetensors")
    save_file(change(weights), checkpoint / "model.safetensors", metadata={"format": "pt"})


def truncate_weights(checkpoint: Path) -> None:
    data = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(data[: len(data) // 2])


def ruler_summary(run: str, score: float, **fields) -> dict:
    """A one-row RULER summary as evalkit writes it (fields: schema_version, benchmark, ...)."""
    from evalkit.store.result_format import SCHEMA_VERSION

    row = {"run": run, "step": 1, "task": "niah_single_1", "metric": "string_match_all", "length": 512, "value": score}
    summary = {"schema_version": SCHEMA_VERSION, "benchmark": "ruler", "run": run, "step": 1, "rows": [row]}
    return {**summary, "skipped": [], "provenance": {}, **fields}


def write_summary(out: Path, summary: dict, name: str = "ruler-summary.json") -> Path:
    path = out / summary["run"] / "step-1" / name
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    return path


def descendants(pid: int) -> list:
    """The processes under `pid` (psutil), or none once it has gone."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def command_line(process) -> str:
    """A psutil process's command line, or "" once it has exited (a zombie's cannot be read)."""
    import psutil

    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def any_running(pids) -> bool:
    """Whether any of `pids` is still a live process (exited, reaped or zombie: not running); a
    process that exits while it is looked at counts as gone."""
    import psutil

    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False
