"""The probe on models whose layers mix sliding-window and full attention (tiny, built from configs here).

References: transformers' own eager and sdpa forward of the same model (its own sliding-window
mask), and a hand computation of D and D_logit whose window mask is written from the
definition in transformers' masking_utils (query i sees key j iff i − W < j <= i), checked
against that function element by element.
"""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig, MistralConfig, Qwen2Config

from evalkit.corpus import builtin_tokenizer
from evalkit.probe import PROBE_ATTENTION, measure_shifts, run_probe
from evalkit.probe.run import model_window
from tests.helpers import probe_model as build
from tests.probe.test_reference import rope_by_hand

WINDOW = 16
SEQ = 48  # three windows long
DELTA2 = 16
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.05,
)


def gemma3_config(**changes) -> Gemma3TextConfig:
    settings = dict(SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=LAYER_TYPES)
    return Gemma3TextConfig(**(settings | changes))


def qwen2_config(**changes) -> Qwen2Config:
    settings = dict(SMALL, use_sliding_window=True, sliding_window=WINDOW, layer_types=LAYER_TYPES)
    return Qwen2Config(**(settings | changes))


CONFIGS = {
    "gemma3": gemma3_config,
    "qwen2": qwen2_config,
    "mistral": lambda **changes: MistralConfig(**(SMALL | {"sliding_window": WINDOW} | changes)),  # all slide
}


@pytest.fixture
def long_texts():
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 256, (2, SEQ), generator=generator)
    ids[:, 0] = 1
    return ids


def _causal_lm(config, attention: str):
    from evalkit.probe import register_probe_attention

    register_probe_attention()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention).eval()


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_probe_forward_equals_transformers_own_sliding_window_forward(family, long_texts):
    model = _causal_lm(CONFIGS[family](), PROBE_ATTENTION)
    # The same weights with windows as long as the texts: the windows must matter on these texts.
    unwindowed = _causal_lm(CONFIGS[family](sliding_window=SEQ), "eager")
    with torch.no_grad():
        probed = model(input_ids=long_texts).logits
        for reference in ("eager", "sdpa"):
            model.set_attn_implementation(reference)
            torch.testing.assert_close(probed, model(input_ids=long_texts).logits, rtol=0, atol=2e-5)
        full = unwindowed(input_ids=long_texts).logits
    assert (probed - full).abs().max() > 1e-2


@pytest.mark.parametrize("rope", ["cast", "fp32"])
def test_each_layer_is_measured_with_its_own_window(rope):
    model = build(gemma3_config(), torch.bfloat16)  # Gemma 3: one RoPE table per layer type
    (found,) = measure_shifts(model, torch.arange(1, SEQ + 1)[None], [0], DELTA2, rope=rope)
    assert found.layer_windows == {0: WINDOW, 1: None, 2: WINDOW}
    assert sorted(found.by_layer_type) == ["full_attention", "sliding_attention"]
    assert all(part.total > 0 for part in found.by_layer_type.values())


def _visible_by_definition(seq_len: int, window: int | None) -> torch.Tensor:
    rows, keys = torch.arange(seq_len)[:, None], torch.arange(seq_len)[None, :]
    visible = keys <= rows
    return visible & (keys > rows - window) if window is not None else visible


def test_the_window_definition_is_transformers_own():
    from transformers.masking_utils import sliding_window_causal_mask_function

    allowed = sliding_window_causal_mask_function(WINDOW)
    zero = torch.tensor(0)
    theirs = torch.tensor(
        [[bool(allowed(zero, zero, torch.tensor(i), torch.tensor(j))) for j in range(SEQ)] for i in range(SEQ)]
    )
    assert torch.equal(_visible_by_definition(SEQ, WINDOW), theirs)
    assert int(theirs[SEQ - 1].sum()) == WINDOW  # the query itself and the W − 1 keys before it


def _maps_by_hand(model, token_ids, shift: int):
    """Per layer: its window and, per head, (logits [T, T], probabilities [T, T]) computed by hand."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    captured, hooks = {}, []
    for index, layer in enumerate(model.layers):
        for name in ("q_proj", "k_proj"):
            hooks.append(
                getattr(layer.self_attn, name).register_forward_hook(
                    lambda _m, _i, out, key=(index, name): captured.__setitem__(key, out[0].detach())
                )
            )
    seq_len = token_ids.numel()
    positions = torch.arange(seq_len) + shift
    with torch.no_grad():
        model(input_ids=token_ids[None], position_ids=positions[None])
    for hook in hooks:
        hook.remove()
    maps = []
    for index, kind in enumerate(config.layer_types):
        window = config.sliding_window if kind == "sliding_attention" else None
        visible = _visible_by_definition(seq_len, window)
        q = captured[(index, "q_proj")].view(seq_len, heads, head_dim)
        k = captured[(index, "k_proj")].view(seq_len, kv_heads, head_dim)
        theta = config.rope_parameters["rope_theta"]
        layer_maps = []
        for head in range(heads):
            q_h = rope_by_hand(q[:, head], positions, theta, model.dtype)
            k_h = rope_by_hand(k[:, head // (heads // kv_heads)], positions, theta, model.dtype)
            logits = (q_h @ k_h.T) * head_dim**-0.5
            probs = torch.zeros(seq_len, seq_len)
            for i in range(seq_len):
                seen = visible[i]
                probs[i, seen] = torch.softmax(logits[i, seen].float(), dim=-1).to(model.dtype).float()
            layer_maps.append((logits.float(), probs))
        maps.append((kind, window, layer_maps))
    return maps


def _differences_by_hand(model, token_ids, delta1: int) -> dict[str, tuple[torch.Tensor, float]]:
    """Per layer type: (n_j-weighted columns, D_logit), counting only the entries each layer attends to."""
    seq_len = token_ids.numel()
    found: dict[str, tuple[torch.Tensor, float]] = {}
    first, second = _maps_by_hand(model, token_ids, delta1), _maps_by_hand(model, token_ids, DELTA2)
    for (kind, window, maps_a), (_kind, _window, maps_b) in zip(first, second):
        visible = _visible_by_definition(seq_len, window)
        columns, logit_first = found.get(kind, (torch.zeros(seq_len, dtype=torch.float64), 0.0))
        for (logits_a, probs_a), (logits_b, probs_b) in zip(maps_a, maps_b):
            for j in range(seq_len):
                seen = visible[:, j]
                columns[j] += float((probs_a[seen, j] - probs_b[seen, j]).abs().sum()) / int(seen.sum())
            seen = visible[:, 0]
            logit_first += float((logits_a[seen, 0] - logits_b[seen, 0]).abs().sum()) / int(seen.sum())
        found[kind] = (columns, logit_first)
    return found


def test_per_layer_type_numbers_match_the_hand_computation_and_add_up(long_texts):
    model = build(qwen2_config(), torch.bfloat16)
    (found,) = measure_shifts(model, long_texts[:1], [3], DELTA2)
    model.set_attn_implementation("eager")
    by_hand = _differences_by_hand(model, long_texts[0], 3)
    assert sorted(found.by_layer_type) == sorted(by_hand)
    for kind, (columns, logit_first) in by_hand.items():
        part = found.by_layer_type[kind]
        assert float(columns.sum()) > 1e-3  # BF16: a difference worth comparing
        torch.testing.assert_close(part.columns, columns, rtol=1e-5, atol=1e-9)
        assert part.logit_first == pytest.approx(logit_first, rel=1e-5)
    parts = found.by_layer_type.values()
    assert found.total == pytest.approx(sum(part.total for part in parts), rel=1e-12)
    assert found.logit_first == pytest.approx(sum(part.logit_first for part in parts), rel=1e-12)
    torch.testing.assert_close(found.columns, sum(part.columns for part in parts), rtol=1e-12, atol=0)


def test_row_blocks_do_not_change_windowed_numbers(long_texts):
    model = build(gemma3_config(), torch.bfloat16)
    whole = measure_shifts(model, long_texts, [0, 40], DELTA2)
    # 5 query rows per block: blocks start inside, at and beyond the window's reach.
    blocked = measure_shifts(model, long_texts, [0, 40], DELTA2, shifts_per_batch=2, block_elements=3 * 4 * 5 * SEQ)
    for a, b in zip(whole, blocked):
        assert a.total > 0 and a.logit_first > 0
        assert b.total == pytest.approx(a.total, rel=1e-3)
        assert b.logit_first == pytest.approx(a.logit_first, rel=1e-3)
        for kind, part in a.by_layer_type.items():
            assert b.by_layer_type[kind].total == pytest.approx(part.total, rel=1e-3)


def test_the_probe_window_is_the_models_not_its_sliding_layers():
    assert model_window(gemma3_config(max_position_embeddings=32768, sliding_window=512)) == 32768
    assert model_window(MistralConfig(sliding_window=32, max_position_embeddings=128)) == 128
    assert model_window(Qwen2Config(max_position_embeddings=512)) == 512


def test_attention_the_probe_does_not_compute_is_refused(long_texts):
    from transformers import Gemma2Config

    settings = dict(SMALL, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=LAYER_TYPES)
    capped = build(Gemma2Config(**settings, attn_logit_softcapping=50.0), torch.float32)
    with pytest.raises(ValueError, match="soft-capping"):
        measure_shifts(capped, long_texts, [0], DELTA2)


@pytest.fixture(scope="module")
def gemma3_checkpoint(tmp_path_factory):
    """A saved tiny Gemma 3 text checkpoint: a 64-token model whose sliding layers see 16 tokens."""
    tokenizer = builtin_tokenizer()
    config = gemma3_config(
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(1)
    directory = tmp_path_factory.mktemp("tiny-gemma3-ckpt")
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_cli_tokens_runs_beyond_the_sliding_window_and_names_the_real_window(gemma3_checkpoint, tmp_path):
    from typer.testing import CliRunner

    from evalkit.cli import app

    out = tmp_path / "out"
    args = ["probe", "tokens", "--ckpt", gemma3_checkpoint, "--seq", 40, "--n", 1, "--dtypes", "bf16", "--out", out]
    ran = CliRunner().invoke(app, list(map(str, args)))  # in this process: a second one would load torch again
    assert ran.exit_code == 0, ran.output
    stored = json.loads((out / "probe-tokens.json").read_text())
    assert stored["provenance"]["model_window"] == 64
    assert stored["provenance"]["layer_windows"] == [WINDOW, None, WINDOW]
    (precision,) = stored["provenance"]["condition_precision"]  # both per-layer-type RoPE tables read
    assert (precision["weights"], precision["rope_frequencies"]) == ("bf16", "fp32")
    totals = {r["layers"]: r["value"] for r in stored["rows"] if r["metric"] == "attn_diff"}
    assert set(totals) == {"all", "full_attention", "sliding_attention"}
    assert totals["all"] == pytest.approx(totals["full_attention"] + totals["sliding_attention"], rel=1e-12)
    summary = (out / "probe-tokens.md").read_text()
    assert "## Per layer type" in summary and "sliding_attention (2 layers, window 16)" in summary
    assert "64-token window (2 of its 3 layers slide over 16 tokens)" in summary

    # As a user meets it: the one-line error of the real command, refused before a model loads.
    refused = _cli("probe", "tokens", "--ckpt", gemma3_checkpoint, "--seq", 65, "--out", tmp_path / "other")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "error: --seq: 65 tokens is beyond the model's 64-token window (2 of its 3 layers slide over 16 tokens)"
    )
    assert not (tmp_path / "other").exists()


def test_shift_and_length_run_beyond_the_sliding_window(gemma3_checkpoint, tmp_path):
    shift = run_probe("shift", gemma3_checkpoint, tmp_path / "shift", seq_len=40, n_texts=1, delta1="0,16")
    by = {(r["dtype"], r["delta1"], r["layers"]): r["value"] for r in shift["rows"]}
    for dtype in ("bf16", "fp32"):
        parts = by[dtype, 0, "full_attention"] + by[dtype, 0, "sliding_attention"]
        assert by[dtype, 0, "all"] == pytest.approx(parts, rel=1e-12)
        assert by[dtype, 16, "all"] == 0.0
    assert by["bf16", 0, "full_attention"] > 10 * by["fp32", 0, "full_attention"]
    assert shift["summary"]["precision_ratio"]["low_precision"] == by["bf16", 0, "all"]

    length = run_probe("length", gemma3_checkpoint, tmp_path / "length", lengths="8,32,64", n_texts=1, dtypes="bf16")
    logit = {(r["length"], r["layers"]): r["value"] for r in length["rows"]}
    assert {n for n, _ in logit} == {8, 32, 64}
    for n in (8, 32, 64):
        assert logit[n, "all"] == pytest.approx(logit[n, "full_attention"] + logit[n, "sliding_attention"], rel=1e-12)
    values = length["summary"]["by_layer_type"]["values"]
    assert values["full_attention"]["logit_diff_first"] == {8: logit[8, "full_attention"],
                                                            32: logit[32, "full_attention"],
                                                            64: logit[64, "full_attention"]}  # fmt: skip
    assert "D_logit (T=64)" in (tmp_path / "length" / "probe-length.md").read_text()
