"""An imported non-Llama model (a tiny Gemma 3 GGUF: five sliding layers to one global) served by
vLLM's own model class gives the hf engine's greedy answers; an engine that cannot start says why
in one line and keeps vLLM's log in the file it names. Needs vLLM (its CPU build will do)."""

import json

import pytest

from evalkit.errors import UserError

from . import agreement
from .conftest import ENGINE_DTYPE, requires_vllm, start_vllm_engine, stop_vllm_engine

pytestmark = requires_vllm
PROMPTS = ["The grass is green and the sky", "Once upon a time, there", "1, 2, 3, 4,", "tttt t t"]


@pytest.fixture(scope="module")
def imported_gemma3(tmp_path_factory):
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'evalkit[gguf]')")
    from evalkit.models.gguf_import import import_gguf
    from tests.gguf_models import write_gemma3_gguf

    folder = tmp_path_factory.mktemp("gemma3")
    write_gemma3_gguf(folder / "tiny-gemma3.gguf", seed=3)
    return import_gguf(folder / "tiny-gemma3.gguf", folder / "imported", dtype="fp32")


def test_an_imported_gemma3_serves_like_the_hf_engine(imported_gemma3):
    from evalkit.engines import get_engine

    hf_engine = get_engine("hf", imported_gemma3, dtype=ENGINE_DTYPE, device="cpu", batch_size=4)
    prompts = [prompt * 4 for prompt in PROMPTS]  # beyond the 8-token window of the sliding layers
    engine = start_vllm_engine(imported_gemma3, batch_size=4)
    try:
        assert engine.engine_info()["model_class"] == "Gemma3ForCausalLM"
        answers = engine.generate(prompts, 24)
        if ENGINE_DTYPE == "bf16":  # teacher-forced (agreement.py: free-running bf16 texts part)
            assert agreement.plain_agreement(engine, hf_engine.model, [engine.encode(p) for p in prompts], 24) == []
    finally:
        stop_vllm_engine(engine)
    if ENGINE_DTYPE == "fp32":
        assert answers == hf_engine.generate(prompts, 24)
    assert len(set(answers)) > 1  # not one degenerate answer for every prompt


def test_an_engine_that_cannot_start_is_one_line_naming_the_cause_and_its_log(imported_gemma3, tmp_path, monkeypatch):
    """The issue's case: config.json without `architectures` (as evalkit import wrote it before):
    vLLM resolves Gemma 3 as a pooling model and fails inside its engine-core process."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in imported_gemma3.iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    del config["architectures"]
    (broken / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("EVALKIT_VLLM_LOG_DIR", str(tmp_path / "logs"))
    with pytest.raises(UserError) as caught:
        start_vllm_engine(broken, batch_size=1)
    line = str(caught.value)
    assert "\n" not in line and line.startswith("vLLM failed to start: ValueError: "), line
    assert "Gemma3ModelForEmbedding" in line  # the root cause, from the worker process's log
    (log,) = (tmp_path / "logs").glob("*.log")
    assert line.endswith(f"its log: {log}") and "Traceback" in log.read_text()
