"""evalkit's import layers: no package imports one above it, and nothing imports in a circle.

An AST scan of every module under evalkit/ (no import is executed), counting every import: at
the top of a module, inside a function (a lazy import is still a dependency, and a circle through
one is still a circle) and under TYPE_CHECKING. A unit is a top-level module or package of evalkit
(`evalkit.files`, `evalkit.ruler`); LAYERS orders them from the bottom up, as docs/architecture.md's
"import layers" state. A unit may import units of its own layer or below.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "evalkit"

# From the bottom up. A unit may import from its own layer and the layers below it, never above.
LAYERS = (
    ("errors",),
    ("arglists", "lengths", "markdown", "package_data", "files", "figures"),  # parsing, tables, files, figures
    ("models",),  # checkpoints on disk: a directory or a hub name, step folders, dtypes, GGUF import
    ("store",),  # results on disk: sample logs, summaries, their identity and provenance, averages
    ("attention", "corpus"),
    ("vllm_plugin",),
    ("engines",),
    ("train",),
    ("sweep",),  # the running of a sweep: the pipeline, the engine choice, shards, the Ray executor
    ("ruler", "general", "probe", "ppl"),  # the benchmarks (and the BF16 RoPE probe)
    ("results",),  # reads stored results only: imports no benchmark and no sweep
    ("quickstart",),
    ("cli",),
)

# Module circles allowed, each with its reason. None may be a package cycle.
ALLOWED_MODULE_CIRCLES: dict[frozenset[str], str] = {
    frozenset({"evalkit.train.config", "evalkit.train.model"}): (
        "train/config.py validates a recipe's RoPE with model.check_rope_theta, imported inside that check, and "
        "model.py builds from a TrainConfig: one package's two halves of the recipe's model, left to train/"
    ),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The evalkit modules `name` imports anywhere in its file: `from pkg import sub` names the
    module pkg.sub, `from pkg import name` the package pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            found.update(subs if len(subs) == len(node.names) else [base, *subs])
    return {target for target in found if target in modules and target != name}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Module -> the evalkit modules it imports, leaving out its own packages' __init__ (a submodule
    of a package imports that package's __init__ by Python's rules, whatever it names)."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = _imports(name, path, modules) - ancestors
    return graph


def _unit(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def _unit_graph(graph: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list]]:
    units: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], list] = defaultdict(list)
    for module, targets in graph.items():
        units[_unit(module)]
        for target in targets:
            if _unit(target) != _unit(module):
                units[_unit(module)].add(_unit(target))
                why[(_unit(module), _unit(target))].append(f"{module} imports {target}")
    return units, why


def test_the_scan_sees_lazy_and_relative_imports():
    """The scan itself, on what it must catch: a lazy import inside a function counts."""
    graph = _graph()
    assert "evalkit.engines" in graph["evalkit.sweep.engine_choice"]  # a lazy one
    assert "evalkit.store.result_format" in graph["evalkit.sweep.pipeline"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_every_unit_has_a_layer():
    layered = [unit for layer in LAYERS for unit in layer]
    assert len(layered) == len(set(layered)), "a unit stands in two layers"
    units = {_unit(module) for module in _graph()} - {"evalkit"}
    assert units == {f"evalkit.{unit}" for unit in layered}, (
        "add a new module or package to LAYERS (and docs/architecture.md)"
    )


def test_no_package_cycle():
    units, why = _unit_graph(_graph())
    found = _cycles(units)
    details = [
        f"{sorted(cycle)}: " + "; ".join(why[(a, b)][0] for a in sorted(cycle) for b in sorted(cycle) if why[(a, b)])
        for cycle in found
    ]
    assert not found, "package cycles:\n" + "\n".join(details)


def test_no_import_against_the_layer_order():
    layer_of = {f"evalkit.{unit}": level for level, layer in enumerate(LAYERS) for unit in layer}
    units, why = _unit_graph(_graph())
    upward = [
        reason
        for unit, targets in sorted(units.items())
        if unit in layer_of
        for target in sorted(targets)
        if target in layer_of and layer_of[target] > layer_of[unit]
        for reason in why[(unit, target)]
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_no_module_circle_beyond_the_allowed():
    circles = [frozenset(cycle) for cycle in _cycles(_graph())]
    unexpected = [sorted(cycle) for cycle in circles if cycle not in ALLOWED_MODULE_CIRCLES]
    assert not unexpected, f"module circles: {unexpected}"
    stale = [sorted(cycle) for cycle in ALLOWED_MODULE_CIRCLES if cycle not in circles]
    assert not stale, f"allowed circles that no longer exist (remove them from the list): {stale}"


def test_results_imports_no_benchmark():
    """results/ sits above the benchmarks and reads stored ResultRows: not one import of a benchmark
    or of the pipeline, lazy ones included (the layer order says it; this names the rule)."""
    found = _found(
        ("evalkit.results",), ("evalkit.ruler", "evalkit.general", "evalkit.sweep.pipeline", "evalkit.probe")
    )
    assert not found, "\n".join(found)


def test_training_imports_no_serving():
    """train/ shares the anchor rule with the engines through attention.anchor, below both: not one
    import of an engine, the vLLM plugin or the lazy engine (lazy ones included)."""
    found = _found(("evalkit.train",), ("evalkit.engines", "evalkit.vllm_plugin", "evalkit.sweep.engine_choice"))
    assert not found, "\n".join(found)


def test_benchmarks_import_no_vllm_plugin():
    """A benchmark reaches vLLM only through the engine interface (engines.base: generate,
    loglikelihood, token_logprobs, the packed requests): not one import of the plugin, lazy ones
    included, so that a new engine is its own module and nothing in the benchmarks."""
    found = _found(("evalkit.ruler", "evalkit.general", "evalkit.ppl"), ("evalkit.vllm_plugin",))
    assert not found, "\n".join(found)


def _found(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """'module imports target' for each import of a `forbidden` module by one of the `importers`."""
    graph = _graph()
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if module.startswith(importers)
        for target in sorted(targets)
        if target.startswith(forbidden)
    ]


def test_the_package_imports_no_test_or_script():
    """evalkit/ is library code: the device checks and their helpers are tests (tests/gpu), the
    timing programs of evalkit itself are programs beside it (perf/)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path} imports {name}" for name in names if name.split(".")[0] in ("tests", "scripts", "perf")]
    assert not found, "\n".join(found)
