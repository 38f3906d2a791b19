"""Results: which checkpoints a command means, the per-sample logs and summaries it writes,
and (later) the aggregates and leaderboards read back from them without re-running anything."""
