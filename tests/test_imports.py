"""test_imports.py — pi2's import graph, built from the source with `ast`: no module imports itself through others
(no import circle, counting imports made inside functions too), and imports sit at the top of their module except
the few below, each with its reason (a dependency that is heavy to load and needed by one path only)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "pi2"

# (module, imported module): why it is imported inside a function
LOCAL_IMPORTS = {
    ("pi2.cli.app", "pi2.cli.commands"): "the commands load numpy and the compiled engine; `pi2 --help` must not",
    ("pi2", "pi2.api"): "`import pi2` (run by every pi2 module) must not load numpy and the engine: on first use",
    ("pi2", "pi2.errors"): "the same",
    ("pi2.cli.net", "pi2.serve.main"): "starlette and uvicorn (an extra) load when pi2 serve runs",
    ("pi2.hub", "huggingface_hub"): "huggingface_hub (an extra, 0.3 s to import) when pi2 pull or -hf runs",
    ("pi2.model.chat", "jinja2"): "Jinja (0.1 s to import) only when a chat template is rendered",
    ("pi2.model.chat", "jinja2.ext"): "the same",
    ("pi2.model.chat", "jinja2.sandbox"): "the same",
    ("pi2.model.gguf_file", "pi2.engine"): "the C core guards a map against SIGBUS when it is built; the GGUF "
                                           "reader also serves tools that run without it",
    ("pi2.reference.quants", "gguf.quants"): "gguf's quantizers (0.5 s to import) only when weights are quantized",
    ("pi2.reference.quants", "gguf.constants"): "the same",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _targets(mod: str, node, mods: dict) -> list:
    """The modules an import statement loads (pi2's submodules resolved; relative imports made absolute)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = mod.split(".") if mods[mod].name == "__init__.py" else mod.split(".")[:-1]
        base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def imports(mods: dict) -> tuple:
    """({module: set of modules imported at module level}, [(module, imported, line) made inside a function])."""
    top, local = {}, []
    for mod, path in mods.items():
        top[mod] = set()

        def visit(node, in_function):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.unparse(ch.test):
                    continue                                    # for type checkers only: never executed
                if isinstance(ch, (ast.Import, ast.ImportFrom)):
                    for t in _targets(mod, ch, mods):
                        (local.append((mod, t, ch.lineno)) if in_function else top[mod].add(t))
                visit(ch, in_function or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        visit(ast.parse(path.read_text(), str(path)), False)
    return top, local


def graph(mods: dict, top: dict, local: list) -> dict:
    """pi2's modules -> the pi2 modules they import, counting the packages an import initialises on the way
    (importing a.b.c runs a/b/__init__.py) but not the importer's own packages (already running)."""
    g = {m: set() for m in mods}
    edges = [(m, t) for m, ts in top.items() for t in ts] + [(m, t) for m, t, _ in local
                                                            if (m, t) not in LOCAL_IMPORTS]
    for m, t in edges:
        parts = t.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in mods and name != m and not m.startswith(name + "."):
                g[m].add(name)
    return g


def cycles(g: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(g):
        if v not in index:
            strong(v)
    return out


def test_no_function_local_imports_but_the_listed_ones():
    mods = modules()
    _, local = imports(mods)
    found = {(m, t) for m, t, _ in local}
    unlisted = sorted(f"{m}:{line} imports {t}" for m, t, line in local if (m, t) not in LOCAL_IMPORTS)
    assert not unlisted, "imports inside functions (move them to the top, or list them here with a reason):\n" + \
        "\n".join(unlisted)
    stale = sorted(f"{m} -> {t}" for m, t in LOCAL_IMPORTS if (m, t) not in found)
    assert not stale, "listed local imports that no longer exist:\n" + "\n".join(stale)


def test_no_import_circles():
    mods = modules()
    top, local = imports(mods)
    found = cycles(graph(mods, top, local))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_graph_sees_circles():
    """The checks above fail when they should: a made-up circle and a made-up local import are found."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(g) == [["a", "b", "c"]]
    mods = {"pi2.x": ROOT / "x.py", "pi2.y": ROOT / "y.py"}
    top = {"pi2.x": {"pi2.y"}, "pi2.y": set()}
    assert cycles(graph(mods, top, [("pi2.y", "pi2.x", 3)])) == [["pi2.x", "pi2.y"]]


def test_production_code_reaches_the_reference_only_where_it_is_the_specification():
    """The C engine's path (plan, session, CLI) loads no pi2.reference module but through the reference engine
    (pi2/runtime/session.py), the converter (which profiles with it) and pi2/reference itself."""
    mods = modules()
    top, local = imports(mods)
    g = graph(mods, top, local)
    allowed = {"pi2.runtime.session", "pi2.convert.layerwise", "pi2.convert.predictor", "pi2.convert.layout",
               "pi2.convert"}
    users = sorted(m for m, ts in g.items() for t in ts
                   if t.startswith("pi2.reference") and not m.startswith("pi2.reference") and m not in allowed)
    assert not users, users
