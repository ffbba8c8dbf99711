"""The `engine` package's import graph, read statically with `ast` (nothing is imported, so it runs in well under a
second): no cycle, counting the imports inside functions too (an import moved into a function to dodge a cycle still
ties the two modules together), and no private name (`_x`) imported from another module.

An edge goes from a module to the module it names: `from engine.a import b` names `engine.a.b` when that is a module,
else `engine.a`. Python also runs a package's `__init__` before any of its submodules; that implicit edge is left out,
since a package that imports its own submodules would otherwise always be a "cycle".
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine"


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ENGINE.rglob("*.py"))}


def is_type_checking_block(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:`: imports for annotations only, never run, so no cycle at run time."""
    return isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"


# What holds statements: an import is a statement, and statements sit only in statements' bodies, an `except`'s and
# a `case`'s, never inside an expression.
HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every statement of `tree`, function bodies included, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node)
                     if isinstance(child, HOLDS_STATEMENTS) and not is_type_checking_block(child))


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, str, int, tuple[str, ...]]]:
    """(imported module, how it was written, line, names taken from it) for each `engine` import in the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in runtime_nodes(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name, f"import {alias.name}", node.lineno, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            if source not in modules:
                continue
            taken = tuple(alias.name for alias in node.names)
            submodules = [f"{source}.{item}" for item in taken if f"{source}.{item}" in modules]
            names = tuple(item for item in taken if f"{source}.{item}" not in modules)
            for submodule in submodules:
                yield submodule, f"from {source} import {submodule.rpartition('.')[2]}", node.lineno, ()
            if names:
                yield source, f"from {source} import {', '.join(names)}", node.lineno, names


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {imported module: "path:line how"} over every module of `engine`."""
    modules = engine_modules()
    graph: dict[str, dict[str, str]] = {name: {} for name in modules}
    for name, path in modules.items():
        for target, written, line, _ in imports_of(name, path, modules):
            if target != name:
                graph[name].setdefault(target, f"{path.relative_to(ENGINE.parent)}:{line} {written}")
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle of `graph` as its modules in order (the first repeated at the end), or None: an iterative
    depth-first search that stops at the first edge back into the current path."""
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        path, on_path = [root], {root}
        pending = [iter(sorted(graph[root]))]
        while pending:
            following = next(pending[-1], None)
            if following is None:  # every module this one imports is explored: leave it
                left = path.pop()
                on_path.discard(left)
                done.add(left)
                pending.pop()
                continue
            if following in on_path:
                return path[path.index(following):] + [following]
            if following not in done:
                path.append(following)
                on_path.add(following)
                pending.append(iter(sorted(graph[following])))
    return None


def test_engine_has_no_import_cycle() -> None:
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        steps = "\n".join(f"  {a} -> {b}   ({graph[a][b]})" for a, b in zip(cycle, cycle[1:]))
        raise AssertionError(f"import cycle in engine:\n{steps}")


def test_no_private_name_imported_across_modules() -> None:
    modules = engine_modules()
    found = []
    for name, path in modules.items():
        for target, _, line, names in imports_of(name, path, modules):
            private = [item for item in names if item.startswith("_") and not item.startswith("__")]
            if private and target != name:
                found.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {', '.join(private)} from {target}")
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_the_graph_sees_function_level_imports() -> None:
    """The checker itself: an import inside a function is an edge (engine.cli imports most of engine that way)."""
    graph = import_graph()
    assert "engine.matrix" in graph["engine.cli"] or any(target.startswith("engine.") for target in graph["engine.cli"])
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ""}, "b": {}, "c": {"a": ""}}) is None
