"""The Python package's own structure (python/tessera/), read statically: its modules import each
other without cycles (function-level imports included: a lazy import that hides a cycle counts),
none imports another's private names, reaches into another's private functions, or sets another's
globals. Private modules (_config, _checkpoint_calls, the extension _C) are the shared base."""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "python", "tessera")


def modules():
    return sorted(f[:-3] for f in os.listdir(PACKAGE) if f.endswith(".py") and f != "__init__.py")


def parsed(name):
    with open(os.path.join(PACKAGE, name + ".py")) as f:
        return ast.parse(f.read())


def sibling_imports(tree, names):
    """(module imported, names taken from it) for every `from . import m` / `from .m import x`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                yield node.module.split(".")[0], [a.name for a in node.names]
            else:
                for a in node.names:
                    if a.name in names:
                        yield a.name, []


def test_modules_import_each_other_without_cycles():
    names = set(modules())
    graph = {m: {dep for dep, _ in sibling_imports(parsed(m), names) if dep in names} for m in names}
    cycles = []

    def visit(node, path):
        for dep in graph[node]:
            if dep in path:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif len(path) < len(names):
                visit(dep, path + [dep])

    for m in sorted(names):
        visit(m, [m])
    assert not cycles, "import cycles: %s" % "; ".join(sorted(set(cycles)))


def test_no_module_takes_or_sets_another_modules_private_names():
    names = set(modules())
    found = []
    for m in sorted(names):
        tree = parsed(m)
        imported = {dep for dep, taken in sibling_imports(tree, names) if not taken}  # `from . import m`: m bound
        for dep, taken in sibling_imports(tree, names):
            if not dep.startswith("_"):
                found += ["%s: from .%s import %s" % (m, dep, n) for n in taken if n.startswith("_")]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported \
                    and not node.value.id.startswith("_"):
                if node.attr.startswith("_") or isinstance(node.ctx, ast.Store):
                    found.append("%s:%d: %s.%s%s" % (m, node.lineno, node.value.id, node.attr,
                                                      " set" if isinstance(node.ctx, ast.Store) else ""))
    assert not found, "\n".join(found)
