"""No import cycles inside idemp: the layers point one way (docs/architecture.md).

grimp (the graph behind import-linter) reads every import, lazy ones in functions too, so a
cycle hidden behind a function-level import is still a cycle here.
"""

from __future__ import annotations

import grimp


def cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_cycles_finder_sees_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(name)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert cycles(graph) == [{"a.x", "a.y"}]


def test_idemp_has_no_import_cycle() -> None:
    assert [sorted(c) for c in cycles(grimp.build_graph("idemp"))] == []


def test_config_and_strategies_do_not_import_each_other() -> None:
    graph = grimp.build_graph("idemp")
    assert (
        graph.find_shortest_chain(importer="idemp.strategies.redis_flag", imported="idemp.config")
        is None
    )
    assert (
        graph.find_shortest_chain(importer="idemp.strategies.redisson", imported="idemp.config")
        is None
    )
