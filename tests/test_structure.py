"""The shape of the code (issues 40 and 53): no import cycle among launcher/ and train/ modules (imports inside
functions count too), no function of theirs takes more than 8 parameters (self and cls not counted), the rooms of
each package stand on floors (a room imports only its own modules and rooms below it), the launcher imports from
train/ only the torch-free contract and the job entry point, and one class holds a layout."""
import ast

from tests.support import ROOT

MAX_PARAMETERS = 8
# Each package's rooms, lowest floor first: a room imports its own modules and rooms on lower floors only. A room
# is a folder, or a top-level module standing alone; the package's __init__ (a docstring) belongs to none.
FLOORS = {
    "launcher": [{"settings"}, {"slurm"}, {"placement"}, {"core"}, {"records"}, {"report"}, {"actions"}, {"__main__"}],
    "train": [{"contract"}, {"data", "runtime", "model", "optim"}, {"parallel"}, {"federation"}, {"measure"},
              {"loop"}, {"job"}, {"__main__"}],
}
CORE = "core"  # launcher's top-level modules but __main__: the core every action uses
TRAIN_FOR_THE_LAUNCHER = ("train.contract", "train.job")  # all the launcher may import from train/
MAX_LAUNCHER_TOP_LEVEL = 12
LAYOUT_RECORDS = {"train.contract.result.RunResult"}  # stores a finished run's F, R and S as data


def _modules(*packages: str) -> dict[str, ast.Module]:
    out = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out[name] = ast.parse(path.read_text())
    return out


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    package = name if name.count(".") == 0 or _is_package(name) else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").exists()


def _edges(*packages: str) -> dict[str, set[str]]:
    modules = _modules(*packages)
    return {name: _imports(name, tree, set(modules)) for name, tree in modules.items()}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    edges = _edges("launcher", "train")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def long_parameter_lists() -> list[str]:
    out = []
    for name, tree in _modules("launcher", "train").items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                n = len(params) + bool(a.vararg) + bool(a.kwarg) - bool(params and params[0].arg in ("self", "cls"))
                if n > MAX_PARAMETERS:
                    out.append(f"{name}.{node.name} ({n})")
    return out


def room(name: str) -> str | None:
    """The room of a module: its folder under the package, or the top-level module itself (launcher's are the
    core); None for the package's own __init__."""
    parts = name.split(".")
    if len(parts) == 1:
        return None
    if len(parts) > 2 or _is_package(name):
        return parts[1]
    return CORE if parts[0] == "launcher" and parts[1] != "__main__" else parts[1]


def floor(package: str, name: str) -> int:
    where = room(name)
    found = [i for i, rooms in enumerate(FLOORS[package]) if where in rooms]
    assert found, f"{name}: room {where!r} stands on no floor of {package} (tests/test_structure.py FLOORS)"
    return found[0]


def arrows_up(package: str) -> list[str]:
    """Imports from a room to a room on a higher floor, or to another room on the same floor."""
    out = []
    for name, targets in _edges(package).items():
        if room(name) is None:
            continue
        for target in sorted(targets):
            if room(target) is None or room(target) == room(name):
                continue
            if floor(package, target) >= floor(package, name):
                out.append(f"{name} -> {target}")
    return out


def test_no_import_cycle():
    assert cycles() == []


def test_no_function_takes_more_than_eight_parameters():
    assert long_parameter_lists() == []


def test_no_arrow_runs_back_up_between_rooms():
    assert arrows_up("launcher") == []
    assert arrows_up("train") == []


def test_the_launcher_imports_from_train_only_the_contract_and_the_job_entry_point():
    train = set(_modules("train"))
    modules = _modules("launcher")
    reached = {f"{name} -> {target}" for name, tree in modules.items() for target in _imports(name, tree, train)
               if not target.startswith(TRAIN_FOR_THE_LAUNCHER) and target != "train"}
    assert reached == set()
    contract = _edges("train")
    below = {t for name, targets in contract.items() if name.startswith("train.contract") for t in targets}
    assert {t for t in below if not t.startswith("train.contract")} == set()  # the contract stands alone


def test_the_launcher_is_a_small_core_under_its_actions():
    top = {p.stem for p in (ROOT / "launcher").glob("*.py")}
    assert len(top) <= MAX_LAUNCHER_TOP_LEVEL, sorted(top)
    actions = {p.stem for p in (ROOT / "launcher" / "actions").glob("*.py")} - {"__init__"}
    assert {"run", "plan", "dryrun", "report", "probe", "validate", "prepare", "control", "init_cluster"} <= actions


def test_one_class_holds_a_layout():
    """F, R and S are fields of train.contract.layout.Layout alone; a result record may store them as data."""
    holders = set()
    for name, tree in _modules("launcher", "train").items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                          and isinstance(s.target, ast.Name)}
                if {"F", "R", "S"} <= fields:
                    holders.add(f"{name}.{node.name}")
    assert holders == {"train.contract.layout.Layout", *LAYOUT_RECORDS}


def test_no_module_is_long_without_saying_why():
    """Over 400 lines, a module's docstring says why it is one module (a line starting 'Long:')."""
    long = []
    for path in sorted([*(ROOT / "launcher").rglob("*.py"), *(ROOT / "train").rglob("*.py")]):
        text = path.read_text()
        if len(text.splitlines()) > 400 and "\nLong: " not in (ast.get_docstring(ast.parse(text)) or ""):
            long.append(f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    assert long == []
