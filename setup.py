"""The package list for setuptools (everything else is in pyproject.toml).

The top-level configs/ and tasks/ (the design card's layout) install inside the package, as
evalkit/configs and evalkit/tasks: a plain install carries the recipes and task fixtures, and
evalkit/package_data.py finds them in either place.
"""

from setuptools import find_namespace_packages, setup

MAPPED = {"evalkit.configs": "configs", "evalkit.tasks": "tasks"}

setup(packages=[*find_namespace_packages(include=["evalkit*"]), *MAPPED], package_dir=MAPPED)
