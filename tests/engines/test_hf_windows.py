"""Packed (anchor) requests on a sliding-window model, hf engine: the answers of greedy decoding
without a cache under masks written here from the definition, one per layer type (documents see
themselves and the anchor, the rest sees all before it; sliding layers only the last W tokens,
the anchor included: the model's own mask). A model with attention evalkit cannot reproduce is
refused in one line, before the model is loaded where the command can tell (RULER's check)."""

import pytest
import torch
from transformers import Gemma2Config, Gemma3TextConfig

from evalkit.engines import PackedRequest, get_engine
from evalkit.engines import tokens as tok
from evalkit.errors import UserError
from tests.helpers import decode

WINDOW = 12
DOCUMENTS = [
    "The grass is green. The sky is blue. The sun is yellow. " * 2,
    "One of the special magic numbers for alpha is: 7. " * 2,
    "Memorize the numbers. The sky is blue. " * 2,
]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, tokenizer):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2, attention_dropout=0.0,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("gemma3")
    AutoModelForCausalLM.from_config(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def definition_masks(layout: tok.PackedLayout, length: int, sink: bool = False) -> dict[str, torch.Tensor]:
    """`sink`: the anchor (key 0) seen by every query beyond the window too (window_anchor="sink")."""
    n = layout.num_document_tokens
    doc = torch.tensor(layout.doc_ids)
    full = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        for j in range(i + 1):
            document_row = i < n
            full[i, j] = not document_row or doc[i] == doc[j] or doc[j] == 0  # 0: the anchor
    distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    seen = distance < WINDOW
    if sink:
        seen[:, 0] = True
    return {"full_attention": full[None, None], "sliding_attention": (full & seen)[None, None]}


def greedy_under_masks(model, ids: list[int], max_new_tokens: int, eos: set[int], layout, sink=False) -> list[int]:
    """Greedy decoding the slow way: the whole sequence re-run per token, one mask per layer type."""
    sequence, generated = list(ids), []
    for _ in range(max_new_tokens):
        masks = definition_masks(layout, len(sequence), sink)
        positions = torch.arange(len(sequence))[None]
        logits = model(input_ids=torch.tensor([sequence]), position_ids=positions, attention_mask=masks).logits
        token = int(logits[0, -1].argmax())
        if token in eos:
            break
        generated.append(token)
        sequence.append(token)
    return generated


def test_packed_answers_on_a_windowed_model_equal_greedy_decoding_under_the_definition(gemma3, tokenizer):
    engine = get_engine("hf", gemma3, dtype="fp32", device="cpu", batch_size=2)  # batching: one by one inside
    requests = [
        PackedRequest(DOCUMENTS, " What is the special magic number for alpha? The number is"),
        PackedRequest(DOCUMENTS[:2], " Which color is the sky?"),
        PackedRequest(DOCUMENTS[1:], " Tell me the number."),
    ]
    answers = engine.generate_packed(requests, 10)
    logits = engine.logits_packed(requests)
    model = engine.model
    model.set_attn_implementation("sdpa")
    for request, answer, row in zip(requests, answers, logits):
        layout = tok.packed_layout(tokenizer, request.documents, request.question)
        assert layout.num_document_tokens > 2 * WINDOW  # the window cuts into documents and the anchor
        n = len(layout.input_ids)
        with torch.no_grad():
            reference = model(
                input_ids=torch.tensor([layout.input_ids]),
                position_ids=torch.arange(n)[None],
                attention_mask=definition_masks(layout, n),
            ).logits[0, -1]
        torch.testing.assert_close(row, reference.log_softmax(-1), atol=1e-4, rtol=0)
        expected = greedy_under_masks(model, layout.input_ids, 10, {tokenizer.eos_token_id}, layout)
        assert expected and answer == decode(tokenizer, expected)


def test_a_checkpoint_trained_with_the_sink_reading_is_served_under_it(gemma3, tokenizer, tmp_path):
    """meta.json says window_anchor=sink: the anchor stays visible beyond the window to documents,
    question and decoded tokens alike; engine_info (so the summary) says so."""
    import json
    import shutil

    sink = shutil.copytree(gemma3, tmp_path / "sink")
    (sink / "meta.json").write_text(json.dumps({"step": 1, "attention": {"window_anchor": "sink"}}))
    engine = get_engine("hf", sink, dtype="fp32", device="cpu", batch_size=2)
    assert engine.engine_info()["window_anchor"] == "sink"
    assert get_engine("hf", gemma3, dtype="fp32", device="cpu").engine_info()["window_anchor"] == "window"
    requests = [
        PackedRequest(DOCUMENTS, " What is the special magic number for alpha? The number is"),
        PackedRequest(DOCUMENTS[1:], " Tell me the number."),
    ]
    answers = engine.generate_packed(requests, 10)
    logits = engine.logits_packed(requests)
    model = engine.model
    model.set_attn_implementation("sdpa")
    for request, answer, row in zip(requests, answers, logits):
        layout = tok.packed_layout(tokenizer, request.documents, request.question)
        n = len(layout.input_ids)
        with torch.no_grad():
            ids, positions = torch.tensor([layout.input_ids]), torch.arange(n)[None]
            reference = model(input_ids=ids, position_ids=positions, attention_mask=definition_masks(layout, n, True))
            windowed = model(input_ids=ids, position_ids=positions, attention_mask=definition_masks(layout, n))
        torch.testing.assert_close(row, reference.logits[0, -1].log_softmax(-1), atol=1e-4, rtol=0)
        assert not torch.allclose(row, windowed.logits[0, -1].log_softmax(-1), atol=1e-3)  # the readings differ
        expected = greedy_under_masks(model, layout.input_ids, 10, {tokenizer.eos_token_id}, layout, sink=True)
        assert expected and answer == decode(tokenizer, expected)


def test_packed_requests_refuse_attention_evalkit_cannot_reproduce(tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=32, intermediate_size=64)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = get_engine("hf", tmp_path, dtype="fp32", device="cpu", attention="eager")  # Gemma 2 has no sdpa
    assert engine.generate(["The sky is"], 2)  # plain prompts: transformers' own attention serves them
    with pytest.raises(UserError, match="attention logit soft-capping"):
        engine.generate_packed([PackedRequest(DOCUMENTS[:1], " Which?")], 2)


def test_ruler_anchor_encoding_refuses_before_loading_a_model(gemma3, tmp_path, tokenizer):
    """RULER's check reads config.json only: soft-capping on any engine, windows on vLLM's packed backend."""
    from transformers import AutoModelForCausalLM

    from evalkit.models.refs import CheckpointRef
    from evalkit.ruler.runner import RulerSettings
    from evalkit.sweep.pipeline import check_packed_attention

    anchor = dict(tasks=["niah_single_1"], lengths=[256], encoding="anchor")
    check_packed_attention(CheckpointRef("g3", 1, gemma3), RulerSettings(**anchor))  # hf: windows are served
    with pytest.raises(
        UserError, match="no sliding-window attention .* 2 layers with a 12-token window; use --engine hf"
    ):
        check_packed_attention(CheckpointRef("g3", 1, gemma3), RulerSettings(**anchor, engine="vllm"))
    config = Gemma2Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=1,
                          num_key_value_heads=1, head_dim=32, intermediate_size=64)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="--encoding anchor cannot reproduce this model's attention exactly"):
        check_packed_attention(CheckpointRef("g2", 1, tmp_path), RulerSettings(**anchor))


def test_the_vllm_engine_refuses_the_sink_reading_before_starting(gemma3, tmp_path):
    """vLLM serves the window reading only: packed requests on a sink-trained windowed checkpoint are
    refused from config.json and meta.json alone (no vLLM needed to test it)."""
    import json
    import shutil

    from transformers import AutoConfig

    from evalkit.engines.vllm import check_window_anchor

    config = AutoConfig.from_pretrained(gemma3)
    check_window_anchor(gemma3, config, 512)  # no record: the window reading, served
    sink = shutil.copytree(gemma3, tmp_path / "sink")
    (sink / "meta.json").write_text(json.dumps({"step": 1, "attention": {"window_anchor": "sink"}}))
    with pytest.raises(UserError, match="trained with model.window_anchor=sink .* 12-token window.*use --engine hf"):
        check_window_anchor(sink, config, 512)
    check_window_anchor(sink, config, WINDOW)  # no window shorter than the context: the readings agree


def test_answers_logged_under_the_window_reading_are_not_reused_for_the_sink_reading(gemma3, tmp_path):
    """RULER's anchor encoding logs its answers per checkpoint directory: once meta.json says the
    checkpoint was trained with the sink reading, answers logged before (the window reading) are
    answered anew, not read back; the window reading's own rerun still reads its answers back."""
    import json
    import shutil

    from evalkit.models.refs import resolve_checkpoints
    from evalkit.ruler.runner import RulerBenchmark, RulerSettings
    from evalkit.sweep.pipeline import run_benchmark

    checkpoint = shutil.copytree(gemma3, tmp_path / "run" / "step-1")
    settings = RulerSettings(
        tasks=["niah_single_1"], lengths=[384], num_samples=1, encoding="anchor", doc_tokens=64, dtype="fp32"
    )
    out = tmp_path / "out"
    summary = out / "run" / "step-1" / "ruler-summary.json"

    def engine_record() -> dict:
        return json.loads(summary.read_text())["provenance"]["engine"]

    run_benchmark(RulerBenchmark(settings), resolve_checkpoints([str(checkpoint)]), out)
    assert engine_record()["window_anchor"] == "window"
    logs = sorted((out / "run" / "step-1" / "ruler").rglob("*.jsonl"))
    first = [log.read_text() for log in logs]
    run_benchmark(RulerBenchmark(settings), resolve_checkpoints([str(checkpoint)]), out)
    assert [log.read_text() for log in logs] == first  # read back, nothing answered
    (checkpoint / "meta.json").write_text(json.dumps({"step": 1, "attention": {"window_anchor": "sink"}}))
    run_benchmark(RulerBenchmark(settings), resolve_checkpoints([str(checkpoint)]), out)
    assert engine_record()["window_anchor"] == "sink"  # an engine was built and answered under the sink
    keys = [{json.loads(line)["key"] for line in text.splitlines()} for text in first]
    keys_now = [{json.loads(line)["key"] for line in log.read_text().splitlines()} for log in logs]
    assert all(len(now) == 1 and not now & then for now, then in zip(keys_now, keys))  # the sink's answers only


def test_packed_batch_size_taken_as_1_on_a_windowed_model_is_said_in_the_log_and_the_summary(gemma3, tokenizer, capsys):
    """Sliding layers take packed requests one at a time whatever --batch-size says: engine_info (the
    summary's provenance.engine) and the log say so, once."""
    engine = get_engine("hf", gemma3, dtype="fp32", device="cpu", batch_size=4)
    info = engine.engine_info()
    assert info["batch_size"] == 4 and info["packed_batch_size"] == 1
    assert info["packed_batch_note"].startswith("--batch-size 4 taken as 1 for packed (anchor) requests: 2 sliding")
    engine.generate_packed([PackedRequest(DOCUMENTS[:1], " Which?")] * 2, 2)
    engine.generate_packed([PackedRequest(DOCUMENTS[:1], " Which?")], 2)
    assert capsys.readouterr().err.count("--batch-size 4 taken as 1") == 1
    alone = get_engine("hf", gemma3, dtype="fp32", device="cpu", batch_size=1).engine_info()
    assert alone["packed_batch_size"] == 1 and "packed_batch_note" not in alone  # nothing was changed
