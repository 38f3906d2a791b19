"""The running of a sweep, the same for every benchmark: the pipeline (pipeline.py: the Benchmark
base class, run_benchmark, its checks, summaries, --avg), the engine a benchmark asks for
(engine_choice.py), and scale-out over the pipeline's units (a
checkpoint with a task, or a task at a length): job-array shards (`--shard I/N`: plan.py picks this
process's units; `evalkit merge`: merge.py) or a Ray cluster (`--executor ray`: ray_executor.py,
a checkpoint's units grouped so a model loads once per worker, every write handed back). This
process alone writes the summaries. The command line (options, progress, report) is evalkit.cli's.
"""
