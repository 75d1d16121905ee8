"""pgfleet's modules import each other without cycles, and none imports another
inside a function to dodge one.

Read from the source with ``ast`` (nothing is imported): every ``import`` of a
pgfleet module counts, at module level, under ``if TYPE_CHECKING``, or inside a
function. A function-local import of a pgfleet module must say why it is late on
its line (or the line above) with ``# lazy: <reason>``: an optional extra
(aiohttp, prometheus_client) or a start-up cost, never a cycle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pgfleet

PACKAGE = Path(pgfleet.__file__).parent
ALLOW = "# lazy:"

# Known cycles, each as the set of its modules. Empty: keep it so.
KNOWN_CYCLES: list[set[str]] = []

# Known function-local imports of pgfleet modules without a reason, as (module,
# imported). Empty: keep it so.
KNOWN_LOCAL: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the pgfleet module imported
    line: int
    local: bool  # inside a function
    allowed: bool  # carries ``# lazy:``


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The pgfleet module ``name`` is, or is in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def allowed(node: ast.stmt) -> bool:
        end = node.end_lineno or node.lineno
        span = lines[max(node.lineno - 2, 0) : end]
        return any(ALLOW in text for text in span)

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    stem = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    stem = child.module or ""
                # `from pgfleet import context` imports the module pgfleet.context.
                targets = [
                    f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in MODULES else stem
                    for alias in child.names
                ]
            for name in targets:
                target = _resolve(name) if name.split(".")[0] == "pgfleet" else None
                if target is not None and target != module:
                    assert isinstance(child, ast.stmt)
                    found.append(Import(module, target, child.lineno, local, allowed(child)))
            visit(child, inner)

    visit(tree, False)
    return found


IMPORTS = [found for module, path in MODULES.items() for found in _imports(module, path)]


def _cycles() -> list[set[str]]:
    """The strongly connected components of the import graph with more than one module."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for found in IMPORTS:
        graph[found.module].add(found.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
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

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_the_walk_sees_the_package() -> None:
    assert {"pgfleet", "pgfleet.cli", "pgfleet.config", "pgfleet.service.worker_cmd"} <= set(
        MODULES
    )
    assert any(
        i.module == "pgfleet.cli" and i.target == "pgfleet.service.worker_cmd" for i in IMPORTS
    )
    # function-level imports are seen too
    assert any(i.local and i.target == "pgfleet.service.http" for i in IMPORTS)


def test_no_import_cycle() -> None:
    cycles = [sorted(c) for c in _cycles() if c not in KNOWN_CYCLES]
    edges = {
        (i.module, i.target, i.line)
        for i in IMPORTS
        for c in cycles
        if i.module in c and i.target in c
    }
    assert not cycles, f"import cycles: {cycles}; their imports: {sorted(edges)}"


def test_no_function_local_import_without_a_reason() -> None:
    late = sorted(
        f"{i.module}:{i.line} imports {i.target}"
        for i in IMPORTS
        if i.local and not i.allowed and (i.module, i.target) not in KNOWN_LOCAL
    )
    assert not late, (
        f"function-local imports of pgfleet modules (import at the top, or say why it "
        f"is late with '{ALLOW} <optional extra | start-up cost>'): {late}"
    )


def test_the_known_lists_hold_only_what_is_still_there() -> None:
    """So the lead sees when an entry can go."""
    assert [c for c in KNOWN_CYCLES if c not in _cycles()] == []
    still = {(i.module, i.target) for i in IMPORTS if i.local and not i.allowed}
    assert KNOWN_LOCAL - still == set()
