"""The on-disk formats and stores of results: a unit's sample log and summary, their schema and
identity, the provenance stamped into each, and the averages read back from them."""
