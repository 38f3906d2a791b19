"""LongBench's own prompts for the offline LongBench-style fixtures, read from lm-eval at run time.

Each fixture task (evalkit_fixture_longbench_<task>.yaml) is scored by lm-eval's LongBench
metric for <task> and prompted with lm-eval's LongBench template for <task>: the template is
read from lm-eval's installed task file (lm_eval/tasks/longbench/<task>.yaml) and rendered the
way lm-eval renders templates, so the fixtures test exactly what `--tasks longbench_<task>`
runs, on data written for evalkit instead of the downloaded dataset.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files


def _yaml_loader():
    """A safe YAML loader that reads `!function x.y` tags as plain strings (only data is wanted here)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return Loader


@cache
def longbench_config(task: str) -> dict:
    """lm-eval's task file for LongBench's `task` (hotpotqa, gov_report, ...) as a dict."""
    import yaml

    text = (files("lm_eval.tasks") / "longbench" / f"{task}.yaml").read_text(encoding="utf-8")
    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader plus one string tag)


def _prompt(task: str, doc: dict) -> str:
    from lm_eval.utils import apply_template

    return apply_template(longbench_config(task)["doc_to_text"], doc)


def hotpotqa(doc: dict) -> str:
    return _prompt("hotpotqa", doc)


def hotpotqa_e(doc: dict) -> str:
    return _prompt("hotpotqa_e", doc)


def gov_report(doc: dict) -> str:
    return _prompt("gov_report", doc)


def passage_count(doc: dict) -> str:
    return _prompt("passage_count", doc)


def lcc(doc: dict) -> str:
    return _prompt("lcc", doc)


def trec(doc: dict) -> str:
    return _prompt("trec", doc)
