"""evalkit's timing programs (`python -m perf --help`, from the repository's root)."""
