"""Where evalkit's shipped data folders are, in a checkout and in an installed package alike.

The repository keeps recipes and lm-eval task YAMLs at its top, configs/ and tasks/ (the design
card's layout), beside the package; setup.py installs them inside it, as evalkit/configs and
evalkit/tasks, so a plain (non-editable) install carries them. The tiny study's checkpoints
live inside the package in both (evalkit/checkpoints).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_folder(name: str) -> Path:
    """evalkit/<name> in an installed package, else <checkout>/<name> (a checkout, or an editable install)."""
    installed = PACKAGE_DIR / name
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


CONFIG_DIR = shipped_folder("configs")  # named training recipes
TASKS_DIR = shipped_folder("tasks")  # evalkit's lm-eval task YAMLs and offline fixtures


def recipe_folder(recipe: Path) -> Path:
    """The folder a recipe's relative paths (../checkpoints/x) and shipped runs are counted from.

    A recipe of one's own: its own folder. evalkit's recipes: the installed layout's folder,
    evalkit/configs, whose ../checkpoints is evalkit/checkpoints, in a checkout too (where the
    recipes sit at the top, one folder away from the checkpoints).
    """
    recipe = recipe.resolve()
    return PACKAGE_DIR / "configs" if recipe.parent == CONFIG_DIR.resolve() else recipe.parent
