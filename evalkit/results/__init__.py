"""Stored results read back, never re-run: summaries under directories, leaderboards, plots and
comparisons, all from evalkit.store.result_format's ResultRows (this package imports no benchmark)."""
