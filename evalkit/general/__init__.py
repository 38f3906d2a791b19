"""General tasks (mmlu, hellaswag, any lm-evaluation-harness task or group) on evalkit's engines
(`evalkit general`).

lm-eval defines the tasks, prompts, few-shot sampling and metrics; evalkit answers its requests
with the engine RULER uses (adapter.EngineLM), so a checkpoint is scored with one dtype, attention
and tokenization everywhere. A request over the model window is never silently truncated (adapter.py);
standard shots: catalog.STANDARD_FEWSHOT. evalkit's tasks/ folder (offline fixtures with mmlu's
and hellaswag's shapes) is always on the include path.

    from evalkit.general import GeneralBenchmark, GeneralSettings, general_checkpoint_table
    from evalkit.sweep.pipeline import run_benchmark
    settings = GeneralSettings(["mmlu", "hellaswag"], engine_settings={"dtype": "bf16", "batch_size": 8})
    run = run_benchmark(GeneralBenchmark(settings), refs, Path("results/general"), avg=True)
    run.rows, run.skipped, run.averages  # a sweep.pipeline.EvaluationRun
    general_checkpoint_table(run.result_rows())

Nothing heavy is imported here: lm_eval and transformers load when a run starts.
"""

from evalkit.general.runner import GeneralBenchmark, GeneralSettings
from evalkit.general.tables import general_average_table, general_checkpoint_table, run_averages

__all__ = [
    "GeneralBenchmark",
    "GeneralSettings",
    "general_average_table",
    "general_checkpoint_table",
    "run_averages",
]
