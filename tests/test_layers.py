"""The house's layering, kept by a test: a lower layer never imports a higher one, and packages form no cycle.

Every import in the package counts, function-level ones included (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> layer; a package imports only packages of lower layers (packages of one layer are independent).
# reference/ (torch) sits above rewards; methods name it only as a string, imported on demand.
LAYERS = {
    "records": 0, "config": 0, "distributed": 0, "kernels": 0,
    "digests": 0, "locks": 0, "platforms": 0, "interrupts": 0,  # process-level utilities: files, locks, signals,
    "compile_cache": 0,  # and the persistent compilation cache
    "models": 1, "data": 1, "rewards": 1,
    "reference": 2, "testing": 2, "methods": 2,
    "rollout": 3,
    "eval": 4,
    "rl": 5, "suites": 5,  # the papers' evaluation suites: each benchmark's loader, layout, scorer; protocols, runner
    "cli": 6,
}


def _source_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for spatial_jax/."""
    out = {}
    for path in sorted((root / "spatial_jax").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(p for p in parts if p != "__init__")] = path
    return out


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "spatial_jax" and len(parts) > 1 else None


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """package -> the project packages its modules import."""
    graph: dict[str, set[str]] = {}
    for module, path in _source_files(root).items():
        src = _package(module)
        if src is None:
            continue
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names] if base == "spatial_jax" else [base]
            for target in targets:
                dst = _package(target)
                if dst is not None and dst != src:
                    graph.setdefault(src, set()).add(dst)
        graph.setdefault(src, set())
    return graph


def _imported_names(module: str, path: Path) -> list[str]:
    """The dotted names a module imports (`from a.b import c` gives a.b.c: a module or a name in a.b)."""
    is_pkg = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(anchor + ([base] if base else []))
            names += [f"{base}.{a.name}" for a in node.names]
    return names


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the modules of its own package that it imports (function-level imports included)."""
    files = _source_files(root)

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        targets = {owner(name) for name in _imported_names(module, path)}
        graph[module] = {t for t in targets if t and t != module and _package(t) == _package(module)}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more nodes that reach each other (Tarjan), each sorted: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for src, dsts in sorted(graph.items()):
        if src not in LAYERS:
            out.append(f"package {src} has no layer")
            continue
        for dst in sorted(dsts):
            if dst in LAYERS and LAYERS[dst] >= LAYERS[src]:
                out.append(f"{src} (layer {LAYERS[src]}) imports {dst} (layer {LAYERS[dst]})")
    return out


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle's smallest rotation, found by depth-first search from each package."""
    cycles = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            if nxt == start:
                i = path.index(min(path))
                cycles.add(tuple(path[i:] + path[:i]))
            elif nxt not in path and nxt > start:
                walk(start, nxt, path + [nxt])

    for start in graph:
        walk(start, start, [start])
    return [list(c) for c in sorted(cycles)]


def test_lower_layers_never_import_higher_ones():
    assert layer_violations(import_graph()) == []


def test_packages_form_no_cycle():
    assert package_cycles(import_graph()) == []


def test_no_package_holds_an_import_cycle_between_its_modules():
    assert strongly_connected(module_graph()) == []


def test_the_module_check_sees_a_planted_cycle_and_a_function_level_import():
    graph = module_graph()
    assert all(_package(m) == _package(t) for m, ts in graph.items() for t in ts)
    # models/config.py once imported the registry inside two methods while the registry imports the config
    assert "spatial_jax.models.config" in graph["spatial_jax.models.registry"]
    graph["spatial_jax.models.config"] = graph["spatial_jax.models.config"] | {"spatial_jax.models.registry"}
    (cycle,) = strongly_connected(graph)  # with the modules that import the config and that the registry imports
    assert {"spatial_jax.models.config", "spatial_jax.models.registry", "spatial_jax.models.vision"} <= set(cycle)
    # a name imported from a module counts as that module: `from spatial_jax.rl.learner import Learner`
    assert "spatial_jax.rl.learner" in module_graph()["spatial_jax.rl.train"]


def test_the_checks_see_a_planted_violation():
    graph = import_graph()
    graph["kernels"] = graph["kernels"] | {"rewards"}
    graph["rewards"] = graph["rewards"] | {"kernels"}
    assert "kernels (layer 0) imports rewards (layer 1)" in layer_violations(graph)
    assert ["kernels", "rewards"] in package_cycles(graph)


def test_the_repo_root_holds_no_package_but_spatial_jax():
    """Tests and scripts run with the repo root on sys.path, where a top-level package would shadow an installed one
    of the same name (a kernels/ folder here once hid the `kernels` package transformers 5.25 imports)."""
    importable = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    importable |= {p.stem for p in ROOT.glob("*.py")} - {"setup"}
    assert importable == {"spatial_jax"}


@pytest.mark.parametrize("name", ["spatialcore", "prosr", "spatialthinker", "allospatial"])
def test_method_names_live_only_in_their_plugins(name):
    """No string comparison or table keyed by a method's name outside methods/ (configs, docs and the dataset's
    reference keys aside)."""
    allowed = {ROOT / "spatial_jax" / "methods" / f"{name}.py", ROOT / "spatial_jax" / "methods" / "__init__.py"}
    offenders = []
    for path in _source_files(ROOT).values():
        if path in allowed or "reference" in path.parts or "testing" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value == name for c in [node.left, *node.comparators]
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == name for k in node.keys):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
