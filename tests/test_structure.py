"""The shape of the code (issue 40): no import cycle among launcher/ and train/ modules (imports inside functions
count too), and no function of theirs takes more than 8 parameters (self and cls not counted)."""
import ast

from tests.support import ROOT

MAX_PARAMETERS = 8


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted([*(ROOT / "launcher").rglob("*.py"), *(ROOT / "train").rglob("*.py")]):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text())
    return out


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    package = name if name in ("launcher", "train") else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    modules = _modules()
    edges = {name: _imports(name, tree, set(modules)) for name, tree in modules.items()}
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
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                n = len(params) + bool(a.vararg) + bool(a.kwarg) - bool(params and params[0].arg in ("self", "cls"))
                if n > MAX_PARAMETERS:
                    out.append(f"{name}.{node.name} ({n})")
    return out


def test_no_import_cycle():
    assert cycles() == []


def test_no_function_takes_more_than_eight_parameters():
    assert long_parameter_lists() == []
