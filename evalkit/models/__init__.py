"""Checkpoints on disk: what a checkpoint is and how it is checked (a directory, a hub name, a
step folder), its dtype rules, and the GGUF import of a released model."""
