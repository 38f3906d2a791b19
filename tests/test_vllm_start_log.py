"""The one line a failed vLLM start becomes: the root cause found in vLLM's own log (engine-core
lines carry a process prefix; vLLM's "initialization failed" wrapper is not the cause)."""

from evalkit.engines.vllm import start_failure_cause

ENGINE_CORE_LOG = """INFO 12-01 16:40:01 [core.py:93] Initializing a V1 LLM engine
(EngineCore_DP0 pid=4242) ERROR 12-01 16:40:09 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "vllm/model_executor/model_loader/default_loader.py", line 280, in load_weights
(Worker pid=28031) ERROR 12-01 16:49:58 [multiproc_executor.py:953] Traceback (most recent call last):
(Worker pid=28031) ERROR 12-01 16:49:58 [multiproc_executor.py:953] ValueError: There is no module or parameter named \
'model' in Gemma3ModelForEmbedding.
(EngineCore pid=26947) ERROR 12-01 16:50:03 [core.py:1510] Exception: WorkerProc initialization failed due to an \
exception in a background process. See stack trace for root cause.
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_the_cause_is_the_last_exception_in_the_log_that_is_not_the_wrapper(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text(ENGINE_CORE_LOG)
    cause = start_failure_cause(log, RuntimeError("Engine core initialization failed. See root cause above."))
    assert cause == "ValueError: There is no module or parameter named 'model' in Gemma3ModelForEmbedding."


def test_without_an_exception_in_the_log_the_raised_one_is_the_cause(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO 12-01 16:40:01 [core.py:93] Initializing a V1 LLM engine\n")
    error = ValueError("1 validation error for ModelConfig\n  Value error, max_model_len 9 > 8 [type=value_error]")
    assert start_failure_cause(log, error) == (
        "ValueError: 1 validation error for ModelConfig Value error, max_model_len 9 > 8 [type=value_error]"
    )
    assert start_failure_cause(tmp_path / "absent.log", KeyError("x")) == "KeyError: 'x'"
