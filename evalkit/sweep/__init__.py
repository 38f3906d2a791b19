"""The running of a sweep, the same for every benchmark (docs/architecture.md's layout, docs/scaling-out.md)."""
