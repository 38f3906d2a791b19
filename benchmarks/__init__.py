"""evalkit's own benchmarks (`python -m benchmarks --help`, from the repository's root)."""
