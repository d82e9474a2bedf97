"""Module globals across modules: the module whose top level binds a global another module reads, through imports,
package re-exports (``from .limits import WS_MB`` in an ``__init__.py``) and star imports. Part of
`flashcheck.verifier.project.Project`'s name resolution."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.index import ClassInfo, FunctionInfo, ModuleInfo, ProjectIndex

__all__ = ["ModuleBindings"]

_MAX_HOPS = 5


class ModuleBindings(ProjectIndex):
    """The globals half of `flashcheck.verifier.project.Project`'s name resolution."""

    _bindings: dict[tuple[int, str], tuple[ModuleInfo, str] | None]  # made by Project
    _star_modules: dict[int, list[ModuleInfo]]

    if TYPE_CHECKING:

        def lookup(self, qualname: str, depth: int = 0) -> FunctionInfo | ClassInfo | ModuleInfo | None: ...

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

    def global_values(self, module: ModuleInfo, name: str) -> list[tuple[ast.expr, FunctionInfo]]:
        """What the global `name` that `module` reads may hold (`ModuleInfo.global_values` of the module that binds
        it, through imports and re-exports)."""
        found = self.binding(module, name)
        return found[0].global_values(found[1]) if found is not None else []


def _exports(module: ModuleInfo) -> frozenset[str] | None:
    """The names a module's ``__all__`` literal lists (what ``from module import *`` brings); None without one."""
    values = module.body.local_assigns.get("__all__", []) if module.body is not None else []
    if len(values) != 1 or not isinstance(values[0], ast.List | ast.Tuple):
        return None
    names = [e.value for e in values[0].elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return frozenset(names) if len(names) == len(values[0].elts) else None
