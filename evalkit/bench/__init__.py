"""Benchmarks users can run (`evalkit bench ...`); their reports go to results/."""
