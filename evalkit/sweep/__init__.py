"""Scale out: one sweep split over job-array shards (`--shard I/N`, `evalkit merge`) or run on a
Ray cluster (`--executor ray`).

Both work on the pipeline's units (a checkpoint with a benchmark unit: a task, a task at a
length). `plan` decides which units this process owns (all of them, or its shard's); the
executor computes them (the local one: in the pipeline's own loop; Ray: on the cluster's
workers, a checkpoint's units grouped so a model is loaded once per worker, which hand every
write back); the pipeline then writes each checkpoint's summary: this process is the one writer.
"""
