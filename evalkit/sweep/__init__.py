"""The running of a sweep, the same for every benchmark: the pipeline, the engine a benchmark asks
for, job-array shards and `evalkit merge`, the Ray executor (docs/architecture.md's layout,
docs/scaling-out.md). This process alone writes the summaries; the command line is evalkit.cli's.
"""
