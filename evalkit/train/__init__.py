"""A minimal long-context continued-pretraining loop producing checkpoints under every paradigm."""

from evalkit.train.config import load_recipe

__all__ = ["load_recipe", "train"]


def train(*args, **kwargs):
    """evalkit.train.loop.train, imported on first use (it pulls in transformers)."""
    from evalkit.train.loop import train as _train

    return _train(*args, **kwargs)
