"""The import graph points one way (issues 14, 37, 58): every module sits in a layer, and imports only its
own layer and the ones below; no circles; a trainer's package imports no other trainer's; and no trainer
is named (as a string) outside the registry and its own package.

What counts as an import is what runs: `import` and `from ... import` lines anywhere (function-level ones
included), and every string constant that names a reflectrl module, "reflectrl.x.y" or "reflectrl.x.y:attr"
(a registry entry, a signal's torch or JAX form, an end-of-run step, an importlib.import_module argument).
A module's layer follows its folder: every module of a package folder is in the layer of that folder (a
subfolder in its parent's, unless listed itself); each top-level module of src/reflectrl is named."""

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "reflectrl"

# lowest first: package folders ("reflectrl.envs": envs/ and everything in it) and top-level modules
LAYERS = [
    ("core", ["reflectrl._version", "reflectrl.errors", "reflectrl.lazyhelp", "reflectrl.torch_setup",
              "reflectrl.overrides", "reflectrl.registry", "reflectrl.config"]),
    ("libraries", ["reflectrl.outputs", "reflectrl.estimators", "reflectrl.nets", "reflectrl.estimators_jax",
                   "reflectrl.nets_jax", "reflectrl.envs", "reflectrl.runs", "reflectrl.sandbox",
                   "reflectrl.distributed", "reflectrl.llm"]),
    ("signals", ["reflectrl.signals"]),
    ("trainer kit", ["reflectrl.trainers"]),  # its shared modules and trainers/onpolicy/
    ("trainers", [f"reflectrl.trainers.{p.name}" for p in sorted((SRC / "trainers").iterdir())
                  if p.is_dir() and (p / "__init__.py").exists() and p.name != "onpolicy"]),
    ("applications", ["reflectrl.evaluate", "reflectrl.training", "reflectrl.experiments", "reflectrl.knobs",
                      "reflectrl.integrations"]),
    ("reports", ["reflectrl.report"]),
    ("tuning", ["reflectrl.sweep"]),  # sweeps run experiments and score them as the report does
    ("commands", ["reflectrl.cli", "reflectrl.__main__", "reflectrl.llm_cli", "reflectrl.api"]),
    # the package's __init__: its version, the built-in registrations it loads (reflectrl.trainers,
    # reflectrl.signals) and the API it exports
    ("package", ["reflectrl"]),
]
TRAINER_PACKAGES = LAYERS[4][1]

# "reflectrl.x.y" or "reflectrl.x.y:attr": a module named by string (a registry entry, importlib's argument)
NAMED = re.compile(r"^reflectrl(\.[A-Za-z_]\w*)+(:[A-Za-z_][\w.]*)?$")
# a name built in pieces (f"reflectrl.signals.{name}", "reflectrl.trainers." + part): it may import any module
# it can complete to, and counts as an arrow to each
PARTIAL = re.compile(r"^reflectrl(\.[A-Za-z_]\w*)*\.$")


def _module_name(path: Path, root: Path = SRC) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, tuple[ast.Module, bool]]:
    """{module: (its syntax tree, whether it is a package's __init__)} of src/reflectrl."""
    return {_module_name(p): (ast.parse(p.read_text()), p.name == "__init__.py") for p in SRC.rglob("*.py")}


def _resolve(name: str, known) -> str | None:
    """The module a dotted name imports: itself where it is one, else the longest module it starts with
    (`from reflectrl.registry import TRAINERS` imports reflectrl.registry)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, tree: ast.Module, is_package: bool, known) -> tuple[set[str], list[str]]:
    """(the modules `module` imports, by statement or by string; the strings that name a module that is
    not there: a stale registration)."""
    out, bad = set(), []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package (level 1) or a parent
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:  # `from reflectrl import overrides` imports the module reflectrl.overrides
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("reflectrl."):
            target = node.value.partition(":")[0]
            if NAMED.match(node.value) and target in known:
                out.add(target)
            elif PARTIAL.match(node.value) and node.value[:-1] in known:
                out.update(m for m in known if m.startswith(node.value))
            elif NAMED.match(node.value) or PARTIAL.match(node.value):
                bad.append(node.value)
    deps = {_resolve(m, known) for m in out if m == "reflectrl" or m.startswith("reflectrl.")}
    return {d for d in deps if d and d != module}, bad


def graph(srcs: dict[str, tuple[ast.Module, bool]]) -> dict[str, set[str]]:
    return {name: imports(name, tree, is_pkg, srcs)[0] for name, (tree, is_pkg) in srcs.items()}


def layer(module: str, packages: set[str]) -> tuple[int, str]:
    """(rank, the LAYERS entry that places it): a top-level module by its name, any other by its folder."""
    folder = module if module in packages else module.rpartition(".")[0]
    if folder == "reflectrl" and module != "reflectrl":
        folder = module  # a top-level module is named itself
    best = (-1, "")
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            inside = folder == entry or folder.startswith(entry + ".") and entry != "reflectrl"
            if inside and len(entry) > len(best[1]):
                best = (rank, entry)
    assert best[0] >= 0, f"{module} is in no layer: add its folder (or, top-level, itself) to LAYERS"
    return best


def arrows_up(srcs: dict[str, tuple[ast.Module, bool]]) -> list[str]:
    """Each import of a higher layer, and each import of one trainer's package by another's. A package's
    __init__ importing its own subpackages (reflectrl.trainers loading each trainer's registration, as
    Gymnasium's envs/__init__ registers its envs) is the folder listing its parts, not an arrow."""
    packages = {name for name, (_, is_pkg) in srcs.items() if is_pkg}
    up = []
    for name, deps in graph(srcs).items():
        rank, home = layer(name, packages)
        for dep in deps:
            if name in packages and dep in packages and dep.rpartition(".")[0] == name:
                continue
            dep_rank, dep_home = layer(dep, packages)
            if dep_rank > rank:
                up.append(f"{name} ({LAYERS[rank][0]}) -> {dep} ({LAYERS[dep_rank][0]})")
            elif dep_rank == rank and home in TRAINER_PACKAGES and dep_home != home:
                up.append(f"{name} -> {dep}: one trainer's package imports another's")
    return sorted(up)


def circles(srcs: dict[str, tuple[ast.Module, bool]]) -> list[list[str]]:
    """The import circles, except a package's __init__ with its own modules (a signal's registration names
    its torch form by string, which imports the knobs back from it)."""
    deps = graph(srcs)
    state: dict[str, int] = {}
    found = []

    def visit(node, stack):
        state[node] = 1
        for dep in sorted(deps[node]):
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for node in sorted(deps):
        if node not in state:
            visit(node, [node])

    def own(cycle):
        heads = [m for m in cycle if srcs[m][1] and all(c == m or c.startswith(m + ".") for c in cycle)]
        return bool(heads)

    return [c for c in found if not own(c)]


def test_every_import_points_down():
    up = arrows_up(sources())
    assert not up, "imports running up:\n" + "\n".join(up)


def test_no_import_circles():
    found = circles(sources())
    assert not found, f"import circles: {found}"


def test_modules_named_by_string_exist():
    srcs = sources()
    bad = {name: imports(name, tree, is_pkg, srcs)[1] for name, (tree, is_pkg) in srcs.items()}
    bad = {name: strings for name, strings in bad.items() if strings}
    assert not bad, f"strings that name a module that is not there (a stale registration?): {bad}"


def _fake(modules: dict[str, str]) -> dict[str, tuple[ast.Module, bool]]:
    """A fake source tree: {module (a trailing '/' marks a package's __init__): its code}."""
    return {name.rstrip("/"): (ast.parse(code), name.endswith("/")) for name, code in modules.items()}


def test_the_checker_sees_a_string_import_running_up_and_a_circle():
    fake = _fake({
        "reflectrl/": "",
        "reflectrl.registry": "SPEC = 'reflectrl.signals.toy.torch:Toy'",  # named, not imported
        "reflectrl.signals/": "",
        "reflectrl.signals.toy/": "from reflectrl.registry import SPEC",
        "reflectrl.signals.toy.torch": "from reflectrl.signals.toy import Config",
        "reflectrl.runs/": "",
        "reflectrl.runs.a": "def f():\n    from reflectrl.runs import b",
        "reflectrl.runs.b": "import importlib\nimportlib.import_module('reflectrl.runs.a')",
    })
    assert arrows_up(fake) == ["reflectrl.registry (core) -> reflectrl.signals.toy.torch (signals)"]
    assert sorted(map(tuple, circles(fake))) == [
        ("reflectrl.registry", "reflectrl.signals.toy.torch", "reflectrl.signals.toy", "reflectrl.registry"),
        ("reflectrl.runs.a", "reflectrl.runs.b", "reflectrl.runs.a")]
    # a package and its own modules are no circle; a trainer package naming another's module is caught
    fake = _fake({
        "reflectrl/": "",
        "reflectrl.signals/": "",
        "reflectrl.signals.toy/": "SPEC = 'reflectrl.signals.toy.torch:Toy'",
        "reflectrl.signals.toy.torch": "from reflectrl.signals.toy import SPEC",
        "reflectrl.trainers/": "",
        f"{TRAINER_PACKAGES[0]}/": f"ENTRY = '{TRAINER_PACKAGES[1]}.x:Y'",
        f"{TRAINER_PACKAGES[1]}/": "",
        f"{TRAINER_PACKAGES[1]}.x": "",
    })
    assert circles(fake) == []
    assert arrows_up(fake) == [f"{TRAINER_PACKAGES[0]} -> {TRAINER_PACKAGES[1]}.x: one trainer's package imports "
                               "another's"]
    # a name built in pieces is an arrow to every module it can complete to; a stale one is reported
    code = "A = 'reflectrl.gone:f'\nB = f'reflectrl.y.{name}'\nC = 'reflectrl.z.' + name"
    assert imports("reflectrl.x", ast.parse(code), False, {"reflectrl.x", "reflectrl.y", "reflectrl.y.a"}) \
        == ({"reflectrl.y.a"}, ["reflectrl.gone:f", "reflectrl.z."])


def test_layers_name_folders_and_top_level_modules_only():
    """The folder rule: a module inside a package folder is placed by its folder, never on its own."""
    for _, entries in LAYERS:
        for entry in entries:
            path = SRC.parent / entry.replace(".", "/")
            top_level = entry.count(".") == 1 and (path.with_suffix(".py").is_file())
            assert entry == "reflectrl" or top_level or (path / "__init__.py").is_file(), (
                f"LAYERS names {entry}: name its folder (a package) or a module of src/reflectrl")


def test_no_trainer_is_named_outside_the_registry_and_its_own_package():
    from reflectrl.registry import TRAINERS

    names = set(TRAINERS)
    found = []
    for name, (tree, _) in sources().items():
        if name == "reflectrl.registry" or any(name == p or name.startswith(p + ".") for p in TRAINER_PACKAGES):
            continue  # a trainer's package names its trainer
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names - SAME_NAME.get(name, set()):
                found.append(f"{name}:{node.lineno} '{node.value}'")
    assert not found, "trainer names outside the registry and their packages:\n" + "\n".join(found)


# another thing with a trainer's name: the loss aggregation TRL calls "grpo" (loss_type=grpo); and --algos
# entries as a user writes them (a trainer alone is an algo: `compare --preset hierarchy` runs ppo and hppo)
SAME_NAME = {"reflectrl.llm.losses": {"grpo"}, "reflectrl.experiments.presets": {"ppo", "hppo", "mappo"}}


def test_nothing_below_the_cli_imports_it():
    for name, deps in graph(sources()).items():
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
