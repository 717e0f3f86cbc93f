"""Check that every import in the repository points down the layers, and that no modules import each other in a circle.

    python scripts/check_layers.py          # prints each import that breaks the order, exit 1 if any

The layers, top to bottom (docs/architecture.md explains each). A package may import packages of a lower layer;
packages of one layer never import each other. Every import counts: function-level ones, and those under
`if TYPE_CHECKING:`, are dependencies a reader has to know about just the same.

Every Python file of the repository is read, the scripts and the tests too. The scripts (benchmarks, fault injection,
tools) are the top layer of the project: they may import anything of sr1, and only the tests import them. The tests
stand above every layer: they may import anything, and nothing imports them. No module anywhere, a script's or a
test's included, is part of a circle.

There are no exceptions: the processes' entry points, which load a job through `config/`, are modules of `sr1/`
(`sr1/entrypoints/`), so no package below `config/` imports it. `tests/unit/test_layers.py` runs this check in CI.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[str, ...]] = [
    ("scripts",),  # benchmarks, fault injection, tools: they may import anything below; nothing imports them
    ("fakes",),  # stand-ins the tests and the benchmarks share: never imported by the product
    ("sr1",),  # the command line, the processes' entry points, the launchers and their supervisor, reports
    ("world",),  # the synthetic tiny world: data, tokenizer, a warm-started policy
    ("config",),  # the root config: composes every role's settings, presets, overrides, job files
    ("learner", "generators"),  # the two pools: they meet only through buffer records
    ("evaluation", "tasks"),  # contracts the pools share: what an evaluation and a task are
    ("retrieval", "weight_sync"),  # the search engine and its client; weight transport
    ("buffer",),  # records, codec, the one Redis client of a run
    ("common",),  # leaf helpers: import paths, model paths, shared config sections, job files
]

LAYER_OF = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}

# One boundary to Redis: only these packages import its client library (`redis`). Every other part names Redis's
# keys and errors through buffer/ (`buffer.connection.REDIS_ERROR`, `RETRIED`; weight sync's keys through
# `weight_sync.rendezvous`, built on `buffer.connection.connect`). scripts/ poke Redis itself (fault injection,
# benchmarks of the buffer).
REDIS_CLIENTS = ("buffer", "scripts")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


# read for circles, and above every layer: the test suite imports anything and nothing imports it
TESTS = "tests"


def project_modules(packages: tuple[str, ...] = tuple(LAYER_OF)) -> dict[str, Path]:
    """The modules of `packages` (by default every layered one, scripts/ included), by dotted name."""
    modules = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[module_name(path)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports, anywhere in the file (a `from package import submodule` names the
    submodule)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    # `from pkg.sub import x` also named `pkg.sub.x` candidates that fell back to `pkg.sub`: harmless duplicates
    return found


def layer(module: str) -> int:
    package = module.split(".")[0]
    return -1 if package == TESTS else LAYER_OF[package]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point up a layer, or sideways into another package of the same layer."""
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            src, dst = module.split(".")[0], target.split(".")[0]
            if src == dst:
                continue
            if layer(target) <= layer(module):
                problems.append(f"{module} imports {target}: {_why(module, target)}")
    return problems


def _why(module: str, target: str) -> str:
    if target.split(".")[0] == TESTS:
        return "nothing imports the tests (tests/): what a script and a test share lives in fakes/"
    if layer(target) == layer(module):
        return (
            f"{module.split('.')[0]}/ and {target.split('.')[0]}/ are one layer and never import each other"
        )
    return f"{target.split('.')[0]}/ is a higher layer than {module.split('.')[0]}/"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a circle (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def libraries_of(path: Path) -> set[str]:
    """The top-level names of every absolute import in the file (`redis`, `torch`, `buffer`, ...)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def redis_violations(libraries: dict[str, set[str]]) -> list[str]:
    """Modules outside `REDIS_CLIENTS` that import `redis` (`libraries`: module -> the top-level names it imports)."""
    return [
        f"{module} imports redis: only {', '.join(p + '/' for p in REDIS_CLIENTS)} talk to Redis (name its errors "
        "through buffer.connection)"
        for module, names in sorted(libraries.items())
        if "redis" in names and module.split(".")[0] not in REDIS_CLIENTS
    ]


def import_graph() -> dict[str, set[str]]:
    """Every module of the repository (the layered packages and the tests) -> the repository's modules it imports."""
    modules = project_modules() | project_modules((TESTS,))
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        # a package's __init__ is imported with every submodule: an edge from a submodule to its own package's
        # __init__ is not a circle worth reporting, so only edges to other modules are kept
        graph[name] = {t for t in imports_of(name, path, modules) if not name.startswith(t + ".")}
    return graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.parse_args(argv)
    graph = import_graph()
    problems = layer_violations(graph)
    problems += ["modules that import each other: " + " <-> ".join(c) for c in circles(graph)]
    problems += redis_violations({name: libraries_of(path) for name, path in project_modules().items()})
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{len(graph)} modules: every import points down the layers, no circles")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
