"""The layers the imports keep (docs/architecture.md, section 13), held by a test instead of by memory.

Every module of aieng/ is read with ``ast`` (nothing is imported or run); each ``import`` and ``from ...
import`` anywhere in it, at module level, inside functions and under ``if TYPE_CHECKING:``, relative ones
resolved, becomes an edge to the deepest module of the tree it names.  Each module has a layer (``LAYERS``,
low to high); a module may import its own layer or below.  Three rules:

  (a) no import from a lower layer into a higher one;
  (b) no role importing another role (a role's package imports only itself and the layers below);
  (c) no import circle between modules.

Nothing breaks them: ``KNOWN``, the edges allowed to break (a) or (b), is empty since issue 34 (the last
five arrows went with the processing library, item 2).  An exception added there names the issue that
removes it, and an entry that no longer occurs fails the test too, so whoever removes the arrow also
removes its entry.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "aieng"
ROLES = ("aieng.frontend", "aieng.preprocess_workers", "aieng.gpu_executor", "aieng.postprocess_workers",
         "aieng.gateway")
# Low to high.  A module's layer is that of the longest name here that is the module or a package above it
# (``aieng`` itself names only the package's __init__, so a new top-level module must be placed here).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("aieng", "aieng.httpcore", "aieng.envs", "aieng.config"),  # the ground: settings and the HTTP core
    ("aieng.models",),  # the model layer: the repository, the spec, the schema parsers
    # inputs: a request's inputs checked against a spec, answered with the wire protocol's codes, so it
    # stands on the wire, not in the model layer.
    ("aieng.wire", "aieng.inputs"),
    # the processing library: the processors, request reading, the postprocess chain, its ops and the
    # answer; what two roles run (a pool and the executor), below both
    ("aieng.processing",),
    ("aieng.runtime", "aieng.client"),
    ROLES,
    ("aieng.tools",),
    ("aieng.cli",),
)

# (importer, imported) edges allowed to break (a) or (b), each with the issue that removes it: none.
KNOWN: frozenset[tuple[str, str]] = frozenset()


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


@functools.cache
def edges() -> frozenset[tuple[str, str]]:
    """Every (importer, imported) pair between modules of aieng/, wherever in the file the import is."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for me, f in mods.items():
        pkg = me if f.name == "__init__.py" else me.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                target = resolve(n) if n == "aieng" or n.startswith("aieng.") else None
                if target is not None and target != me:
                    out.add((me, target))
    return frozenset(out)


def layer(module: str) -> int | None:
    best = None  # (length of the prefix, layer): the longest prefix decides
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            above = p != "aieng" and module.startswith(p + ".")
            if (module == p or above) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return best[1] if best else None


def role(module: str) -> str | None:
    return next((r for r in ROLES if module == r or module.startswith(r + ".")), None)


def upward(pairs) -> set[tuple[str, str]]:
    return {(a, b) for a, b in pairs if layer(b) > layer(a)}


def across_roles(pairs) -> set[tuple[str, str]]:
    return {(a, b) for a, b in pairs if role(a) and role(b) and role(a) != role(b)}


def circles(pairs) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(pairs):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) is None] == []


def test_no_import_runs_up_a_layer():
    assert sorted(upward(edges()) - KNOWN) == []


def test_no_role_imports_another_role():
    assert sorted(across_roles(edges()) - KNOWN) == []


def test_no_import_circle():
    assert circles(edges()) == []


def test_every_known_exception_still_occurs():
    """Whoever removes an arrow removes its entry: the list only shrinks."""
    assert sorted(KNOWN - (upward(edges()) | across_roles(edges()))) == []


# The rules themselves, on made-up edges: a rule that saw nothing would pass every tree.
def test_an_import_up_a_layer_is_found_and_one_down_is_not():
    pairs = {("aieng.models.repo", "aieng.frontend.server"), ("aieng.wire.shm", "aieng.models.spec"),
             ("aieng.cli.main", "aieng.tools.checks"), ("aieng.inputs", "aieng.runtime.worker")}
    assert upward(pairs) == {("aieng.models.repo", "aieng.frontend.server"),
                             ("aieng.inputs", "aieng.runtime.worker")}


def test_a_role_importing_another_role_is_found_and_one_importing_itself_is_not():
    pairs = {("aieng.gpu_executor.lanes", "aieng.gateway.http"),
             ("aieng.frontend.server", "aieng.frontend.requests.cache"),
             ("aieng.gateway.http", "aieng.runtime.worker")}
    assert across_roles(pairs) == {("aieng.gpu_executor.lanes", "aieng.gateway.http")}


def test_a_module_nobody_placed_has_no_layer():
    assert (layer("aieng.new_module"), layer("aieng.models.new_module"), layer("aieng")) == (None, 1, 0)


def test_a_circle_is_found():
    assert circles({("aieng.a", "aieng.b"), ("aieng.b", "aieng.c"), ("aieng.c", "aieng.a"),
                    ("aieng.c", "aieng.d")}) == [["aieng.a", "aieng.b", "aieng.c"]]
