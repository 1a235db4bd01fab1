"""The import graph points one way (issue 14): nothing imports the CLI, config does not import
signal modules, and no two modules import each other at module level."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "reflectrl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("reflectrl")}


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path, top_level_only) if m in modules and m != name}
    return graph


def test_nothing_below_the_cli_imports_it():
    for name, deps in _graph(top_level_only=False).items():
        if name not in ("reflectrl.cli", "reflectrl.__main__"):
            assert "reflectrl.cli" not in deps, f"{name} imports reflectrl.cli"


def test_config_does_not_import_signal_modules():
    deps = _graph(top_level_only=False)["reflectrl.config"]
    assert not [d for d in deps if d.startswith("reflectrl.signals")], deps
    for name, deps in _graph(top_level_only=False).items():
        if name.startswith("reflectrl.signals"):
            assert "reflectrl.config" not in deps, f"{name} imports reflectrl.config"


def test_no_import_cycles_at_module_level():
    graph = _graph(top_level_only=True)
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in graph[node]:
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])
    # a package's __init__ importing its own submodules is not a cycle of responsibility
    real = [c for c in cycles if not all(m.startswith(c[0].rsplit(".", 1)[0]) for m in c)]
    assert not real, f"import cycles: {real}"
