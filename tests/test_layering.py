"""The import graph points one way (issues 14, 37): every module sits in a layer, and imports only its
own layer and the ones below (function-level imports included); no circles; a trainer's package imports
no other trainer's; and no trainer is named (as a string) outside the registry and its own package."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "reflectrl"

# lowest first; a module's layer is its longest matching prefix
LAYERS = [
    ("core", ["reflectrl.errors", "reflectrl.lazyhelp", "reflectrl.torch_setup", "reflectrl.overrides",
              "reflectrl.registry", "reflectrl.config", "reflectrl.runs.jsonfile"]),
    ("libraries", ["reflectrl.outputs", "reflectrl.estimators", "reflectrl.nets", "reflectrl.estimators_jax",
                   "reflectrl.nets_jax", "reflectrl.envs", "reflectrl.runs",
                   "reflectrl.sandbox",
                   "reflectrl.distributed", "reflectrl.llm.model", "reflectrl.llm.tasks", "reflectrl.llm.losses",
                   "reflectrl.llm.calibration"]),
    ("signals", ["reflectrl.signals"]),
    ("trainer kit", ["reflectrl.trainers"]),
    ("trainers", [f"reflectrl.trainers.{p.name}" for p in (SRC / "trainers").iterdir()
                  if p.is_dir() and (p / "__init__.py").exists() and p.name != "onpolicy"]
                 + ["reflectrl.trainers.ppo_jax"]),  # the JAX backend's PPO and its signals (backend=jax)
    ("applications", ["reflectrl.evaluate", "reflectrl.training", "reflectrl.experiments", "reflectrl.knobs",
                      "reflectrl.llm.sft", "reflectrl.integrations"]),
    ("reports", ["reflectrl.report"]),
    ("tuning", ["reflectrl.sweep"]),  # sweeps run experiments and score them as the report does
    ("commands", ["reflectrl.cli", "reflectrl.__main__", "reflectrl.llm.cli", "reflectrl.sandbox.cli",
                  "reflectrl.llm"]),
]
TRAINER_PACKAGES = LAYERS[4][1]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("reflectrl")}


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text()) for p in SRC.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(tree) if m in modules and m != name} for name, tree in modules.items()}


def _layer(module: str) -> tuple[int, str]:
    if module == "reflectrl":  # the package's own __init__: its version, nothing else
        return 0, module
    best = (-1, "", "")
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best[2]):
                best = (rank, prefix, prefix)
    assert best[0] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[0], best[1]


def test_every_import_points_down():
    up = []
    for name, deps in _graph().items():
        rank, home = _layer(name)
        for dep in deps:
            dep_rank, dep_home = _layer(dep)
            if dep_rank > rank:
                up.append(f"{name} ({LAYERS[rank][0]}) -> {dep} ({LAYERS[dep_rank][0]})")
            elif dep_rank == rank and home in TRAINER_PACKAGES and dep_home != home:
                up.append(f"{name} -> {dep}: one trainer's package imports another's")
    assert not up, "imports running up:\n" + "\n".join(sorted(up))


def test_no_import_circles():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # a package's __init__ importing its own submodules is not a circle of responsibility
    real = [c for c in cycles if not all(m.startswith(c[0].rsplit(".", 1)[0]) for m in c)]
    assert not real, f"import circles: {real}"


def test_no_trainer_is_named_outside_the_registry_and_its_own_package():
    from reflectrl.registry import TRAINERS

    names = set(TRAINERS)
    found = []
    for name, tree in _modules().items():
        if name == "reflectrl.registry" or any(name == p or name.startswith(p + ".") for p in TRAINER_PACKAGES):
            continue  # a trainer's package names its trainer
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names - SAME_NAME.get(name, set()):
                found.append(f"{name}:{node.lineno} '{node.value}'")
    assert not found, "trainer names outside the registry and their packages:\n" + "\n".join(found)


# another thing with a trainer's name: the loss aggregation TRL calls "grpo" (loss_type=grpo)
SAME_NAME = {"reflectrl.llm.losses": {"grpo"}}


def test_nothing_below_the_cli_imports_it():
    for name, deps in _graph().items():
        if name not in ("reflectrl.cli", "reflectrl.__main__"):
            assert "reflectrl.cli" not in deps, f"{name} imports reflectrl.cli"


def test_the_layout_page_names_every_package_and_module():
    text = (SRC.parents[1] / "docs" / "layout.md").read_text()
    names = [p.name for p in SRC.iterdir() if (p.suffix == ".py" and p.stem not in ("__init__", "__main__"))
             or (p.is_dir() and (p / "__init__.py").exists())]
    names += [p.name for p in (SRC / "trainers").iterdir()
              if p.suffix == ".py" and p.stem != "__init__" or (p.is_dir() and (p / "__init__.py").exists())]
    missing = [n for n in names if n.removesuffix(".py") + ("/" if not n.endswith(".py") else ".py") not in text]
    assert not missing, f"docs/layout.md does not place: {missing}"
