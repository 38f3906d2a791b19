"""Scale out: one sweep split over job-array shards (`--shard I/N`, `evalkit merge`) or run on a
Ray cluster (`--executor ray`), both over the pipeline's units (a checkpoint with a task, or a
task at a length). `plan` picks this process's units (all, or its shard's); the executor computes
them (locally in the pipeline's loop; on Ray's workers, a checkpoint's units grouped so a model
loads once per worker, every write handed back); this process alone writes the summaries.
"""
