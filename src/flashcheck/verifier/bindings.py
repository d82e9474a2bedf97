"""Module globals across modules: the module whose top level binds a global another module reads, through imports,
package re-exports (``from .limits import WS_MB`` in an ``__init__.py``) and star imports. Part of
`flashcheck.verifier.project.Project`'s name resolution."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import alias_value, branches, dotted
from flashcheck.verifier.index import ClassInfo, FunctionInfo, ModuleInfo, ProjectIndex

__all__ = ["ModuleBindings", "imported_name"]

_MAX_HOPS = 5


class ModuleBindings(ProjectIndex):
    """The globals half of `flashcheck.verifier.project.Project`'s name resolution."""

    _bindings: dict[tuple[int, str], tuple[ModuleInfo, str] | None]  # made by Project
    _star_modules: dict[int, list[ModuleInfo]]
    _module_items: dict[tuple[str, str], list[tuple[ast.expr, FunctionInfo]]] | None
    _module_keyed: dict[tuple[str, str, str], list[tuple[ast.expr, FunctionInfo]]]

    if TYPE_CHECKING:

        def lookup(self, qualname: str, depth: int = 0) -> FunctionInfo | ClassInfo | ModuleInfo | None: ...

        def all_functions(self) -> Iterator[FunctionInfo]: ...

        def resolve_def(
            self, expr: ast.expr, fn: FunctionInfo | None, depth: int = 0
        ) -> FunctionInfo | ClassInfo | ModuleInfo | None: ...

    def _module_under_folders(self, name: str) -> ModuleInfo | None:
        """A regular package inside namespace folders: ``a.b.pkg.mod`` names the module indexed as ``pkg.mod``
        when ``pkg`` sits in folders ``a/b/`` (without ``__init__.py``, so the index names it from ``pkg`` down)."""
        parts = name.split(".")
        for i in range(1, len(parts)):  # the package itself too: a.b.pkg is pkg's __init__.py
            mod = self.modules.get(".".join(parts[i:]))
            if mod is None:
                continue
            path = mod.source.path
            depth = len(parts) - i - (0 if path.name == "__init__.py" else 1)
            folders = path.parents[depth : depth + i]
            if [f.name for f in reversed(folders)] == parts[:i]:
                return mod
        return None

    def _suffix_module(self, name: str) -> ModuleInfo | None:
        """A module whose dotted name ends with `name` (``srt.layers.x`` for ``src.srt.layers.x``), if unique."""
        if not self._suffixes:
            self._suffixes[""] = None
            for full, mod in self.modules.items():
                parts = full.split(".")
                for i in range(1, len(parts) - 1):
                    key = ".".join(parts[i:])
                    self._suffixes[key] = None if key in self._suffixes else mod
        return self._suffixes.get(name)

    def binding(self, module: ModuleInfo, name: str) -> tuple[ModuleInfo, str] | None:
        """The module whose top level binds the global `name` that `module` reads, and its name there: `module`
        itself, or the project module it imports the name from, followed through re-exports and star imports for a
        few hops; None when no project module binds it (or it names a function or class: `Project.resolve_def`).
        Memoised per module and name."""
        key = (id(module), name)
        if key not in self._bindings:
            self._bindings[key] = self._binding(module, name, 0)
        return self._bindings[key]

    def _stars(self, module: ModuleInfo) -> list[ModuleInfo]:
        """The project modules `module` star-imports (``from .limits import *``)."""
        found = self._star_modules.get(id(module))
        if found is None:
            targets = [self.lookup(t) for k, t in module.imports.items() if k.startswith("*")]
            found = self._star_modules[id(module)] = [
                m for m in targets if isinstance(m, ModuleInfo) and m is not module
            ]
        return found

    def _binding(self, module: ModuleInfo, name: str, depth: int) -> tuple[ModuleInfo, str] | None:
        if depth > _MAX_HOPS:
            return None
        if name in module.global_stores or (module.body is not None and name in module.body.local_assigns):
            return module, name
        if name in module.functions or name in module.classes:
            return None
        target = module.imports.get(name)
        if target is not None:
            source, _, attr = target.rpartition(".")
            found = self.lookup(source) if source else None
            return self._binding(found, attr, depth + 1) if isinstance(found, ModuleInfo) else None
        for star in reversed(self._stars(module)):  # from .limits import *: the last one that binds it wins
            exported = _exports(star)
            if exported is not None and name not in exported:
                continue  # not in its __all__: the star import does not bring it
            bound = self._binding(star, name, depth + 1)
            if bound is not None:
                return bound
        return None

    def module_member(self, module: ModuleInfo, name: str, depth: int) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """``module.name`` where the module neither defines nor imports `name` by name: what a star import brings
        (``from .host import *`` in a package's ``__init__.py``, within the star module's ``__all__``), or the
        definition a top-level alias names (``plan_decode = _impl.plan_decode`` in a facade module)."""
        if depth > _MAX_HOPS:
            return None
        for star in reversed(self._stars(module)):
            exported = _exports(star)
            if (name in exported) if exported is not None else not name.startswith("_"):
                found = self.lookup(f"{star.name}.{name}", depth + 1)
                if found is not None:
                    return found
        values = module.body.local_assigns.get(name, []) if module.body is not None else []
        if len(values) == 1 and isinstance(values[0], ast.Name | ast.Attribute) and module.body is not None:
            found = self.resolve_def(values[0], module.body, depth + 1)
            if isinstance(found, FunctionInfo | ClassInfo):
                return found
        return None

    def link_class_aliases(self) -> None:
        """Fill `ModuleInfo.class_aliases`: each capitalised name a module imports from a project module (through
        re-exports and star imports) where the top level binds it, once (a ``None`` fallback aside), to a FlashInfer
        class (``Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper``, also of a conditional, its first branch)."""
        for module in self.modules.values():
            for name, target in module.imports.items():
                if not name[:1].isupper() or target == "flashinfer" or target.startswith("flashinfer."):
                    continue
                found = self.binding(module, name)
                if found is None or found[0] is module or found[0].body is None:
                    continue
                value = alias_value([v for v, _ in found[0].global_values(found[1])])
                full = imported_name(value, found[0].body, "flashinfer") if value is not None else None
                if full is not None and full.startswith("flashinfer."):
                    module.class_aliases[name] = ast.parse(full, mode="eval").body

    def module_items(self) -> dict[tuple[str, str], list[tuple[ast.expr, FunctionInfo]]]:
        """``name[k] = v`` stores by (module, name), from every function of the module (a global table filled by
        the functions that use it: ``_GRAPHS[bs] = GraphEntry(...)``)."""
        if self._module_items is None:
            self._module_items, self._module_keyed = {}, {}
            for f in self.all_functions():
                for name, values in f.item_stores.items():
                    self._module_items.setdefault((f.module.name, name), []).extend((v, f) for v in values)
                for a in f.assigns:  # _STATE["finished"] = torch.zeros(...) into a global, under that key
                    if not isinstance(a, ast.Assign):
                        continue
                    for t in a.targets:
                        table = t.value if isinstance(t, ast.Subscript) and _str_key(t.slice) else None
                        if isinstance(table, ast.Name) and table.id not in f.local_assigns and table.id not in f.params:
                            key = (f.module.name, table.id, t.slice.value)  # type: ignore[attr-defined]
                            self._module_keyed.setdefault(key, []).append((a.value, f))
        return self._module_items

    def module_keyed_items(self, module: ModuleInfo, name: str, key: str) -> list[tuple[ast.expr, FunctionInfo]]:
        """What the functions of `module` store into its global `name` under the string `key`."""
        self.module_items()
        return self._module_keyed.get((module.name, name, key), [])

    def module_attribute(self, expr: ast.Attribute, fn: FunctionInfo) -> tuple[ModuleInfo, str] | None:
        """The module that binds the global ``mod.name`` reads, and its name there, where ``mod`` names a project
        module (``S.kv_indptr`` after ``from . import state as S``); None for any other attribute."""
        base = expr.value
        if not isinstance(base, ast.Name | ast.Attribute) or (isinstance(base, ast.Name) and base.id == "self"):
            return None
        if isinstance(base, ast.Name) and (base.id in fn.local_assigns or base.id in fn.params):
            return None
        mod = self.resolve_def(base, fn)
        return self.binding(mod, expr.attr) if isinstance(mod, ModuleInfo) else None

    def global_values(self, module: ModuleInfo, name: str) -> list[tuple[ast.expr, FunctionInfo]]:
        """What the global `name` that `module` reads may hold (`ModuleInfo.global_values` of the module that binds
        it, through imports and re-exports)."""
        found = self.binding(module, name)
        return found[0].global_values(found[1]) if found is not None else []

    def module_values(self, values: list[tuple[ast.expr, FunctionInfo]]) -> list[tuple[ast.expr, FunctionInfo]]:
        """`values`, each branch of a conditional apart, and a module global's one value for its name
        (``self._stages = FAST if c else STAGES``: the tuples bound to those names)."""
        out = []
        for v, where in ((b, w) for value, w in values for b in branches(value)):
            free = isinstance(v, ast.Name) and v.id not in where.local_assigns and v.id not in where.params
            held = self.global_values(where.module, v.id) if free and isinstance(v, ast.Name) else []
            out.append(held[0] if len(held) == 1 else (v, where))
        return out


def _exports(module: ModuleInfo) -> frozenset[str] | None:
    """The names a module's ``__all__`` literal lists (what ``from module import *`` brings); None without one."""
    values = module.body.local_assigns.get("__all__", []) if module.body is not None else []
    if len(values) != 1 or not isinstance(values[0], ast.List | ast.Tuple):
        return None
    names = [e.value for e in values[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return frozenset(names) if len(names) == len(values[0].elts) else None


def imported_name(node: ast.AST, fn: FunctionInfo, package: str) -> str | None:
    """The dotted name of `node` with a head imported from `package` spelled out through the module's imports:
    ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` for ``Decode`` after ``from flashinfer import
    BatchDecodeWithPagedKVCacheWrapper as Decode``, ``torch.empty`` for ``T.empty`` after ``import torch as T``.
    Other names are returned as written (None for anything but a Name/Attribute chain)."""
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    target = fn.module.imports.get(head)
    if target is not None and (target == package or target.startswith(package + ".")):
        return f"{target}.{rest}" if rest else target
    return name


def _str_key(key: ast.expr) -> bool:
    return isinstance(key, ast.Constant) and isinstance(key.value, str)
