"""The project index: every module, class and function of the checked files, and a call graph between them.

One walk per function body collects what rules look at (calls, attributes, assignments, asserts, branch tests,
subscripts) so rules never re-walk the tree. Calls are resolved on demand, intra-project only: plain names, nested
and imported functions, ``self.method()`` (including overrides in subclasses), ``super().method()``, attributes
whose type is known from ``self.x = Class(...)`` or an annotation, module aliases and simple local aliases.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from flashcheck.verifier.astutil import dotted
from flashcheck.verifier.source import SourceFile

__all__ = ["ClassInfo", "FunctionInfo", "ModuleInfo", "Project"]

_KINDS: dict[type, str] = {
    ast.Call: "call",
    ast.Attribute: "attr",
    ast.Subscript: "sub",
    ast.Assign: "assign",
    ast.AnnAssign: "assign",
    ast.AugAssign: "assign",
    ast.Assert: "assert",
    ast.If: "test",
    ast.While: "test",
    ast.IfExp: "test",
    ast.Import: "import",
    ast.ImportFrom: "import",
    ast.Return: "return",
    ast.For: "for",
    ast.AsyncFor: "for",
    ast.comprehension: "for",
    ast.With: "with",
}
_SCOPES = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef})
_LEAVES = frozenset(
    {
        ast.Name,
        ast.Constant,
        ast.Load,
        ast.Store,
        ast.Del,
        ast.Pass,
        ast.Break,
        ast.Continue,
        ast.alias,
        ast.Global,
        ast.Nonlocal,
        *ast.operator.__subclasses__(),
        *ast.unaryop.__subclasses__(),
        *ast.cmpop.__subclasses__(),
        *ast.boolop.__subclasses__(),
    }
)
_NOT_NODES = frozenset(
    {
        "ctx",
        "op",
        "ops",
        "id",
        "attr",
        "arg",
        "name",
        "names",
        "module",
        "level",
        "type_comment",
        "kind",
        "conversion",
        "is_async",
        "lineno",
        "col_offset",
    }
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(t: type) -> tuple[str, ...]:
    f = _FIELDS.get(t)
    if f is None:
        f = _FIELDS[t] = tuple(n for n in getattr(t, "_fields", ()) if n not in _NOT_NODES)
    return f


FuncNode = ast.FunctionDef | ast.AsyncFunctionDef
Def = "FunctionInfo | ClassInfo | ModuleInfo"


@dataclass(eq=False)
class FunctionInfo:
    """A function, a method, or a module's top-level code (``name == "<module>"``)."""

    qualname: str
    name: str
    node: FuncNode | ast.Module
    module: ModuleInfo
    cls: ClassInfo | None = None
    parent: FunctionInfo | None = None
    calls: list[ast.Call] = field(default_factory=list)
    attributes: list[ast.Attribute] = field(default_factory=list)
    assigns: list[ast.Assign | ast.AnnAssign | ast.AugAssign] = field(default_factory=list)
    asserts: list[ast.Assert] = field(default_factory=list)
    tests: list[ast.expr] = field(default_factory=list)
    subscripts: list[ast.Subscript] = field(default_factory=list)
    local_assigns: dict[str, list[ast.expr]] = field(default_factory=dict)
    local_defs: dict[str, FunctionInfo] = field(default_factory=dict)
    returns: list[ast.expr] = field(default_factory=list)
    loop_vars: dict[str, list[ast.expr]] = field(default_factory=dict)  # for/comprehension target -> iterable
    item_stores: dict[str, list[ast.expr]] = field(default_factory=dict)  # name[k] = value (containers)
    device_blocks: list[tuple[int, int, ast.expr]] = field(default_factory=list)  # with torch.device(d): lines

    @property
    def source(self) -> SourceFile:
        return self.module.source

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 1)

    @cached_property
    def params(self) -> dict[str, ast.expr | None]:
        """Parameter name -> annotation (None when absent)."""
        if isinstance(self.node, ast.Module):
            return {}
        a = self.node.args
        every = [
            *a.posonlyargs,
            *a.args,
            *a.kwonlyargs,
            *([a.vararg] if a.vararg else []),
            *([a.kwarg] if a.kwarg else []),
        ]
        return {p.arg: p.annotation for p in every}

    @property
    def decorators(self) -> list[ast.expr]:
        return [] if isinstance(self.node, ast.Module) else list(self.node.decorator_list)

    @property
    def short(self) -> str:
        """``Class.method`` or ``function``: the name a reader recognises."""
        return f"{self.cls.name}.{self.name}" if self.cls is not None and self.parent is None else self.name


@dataclass(eq=False)
class ClassInfo:
    qualname: str
    name: str
    node: ast.ClassDef
    module: ModuleInfo
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    # self.<attr> = <expr> anywhere in the class's methods, with the method that assigns it
    attr_assigns: dict[str, list[tuple[ast.expr, FunctionInfo]]] = field(default_factory=dict)
    subclasses: list[ClassInfo] = field(default_factory=list)
    bases: list[ClassInfo] = field(default_factory=list)
    item_assigns: dict[str, list[tuple[ast.expr, FunctionInfo]]] = field(default_factory=dict)  # self.x[k] = v
    attr_types: dict[str, ast.expr] = field(default_factory=dict)  # self.x: T = ... and class-body fields x: T
    fields: list[str] = field(default_factory=list)  # class-body ``x: T`` in order (dataclass constructor order)


@dataclass(eq=False)
class ModuleInfo:
    name: str
    source: SourceFile
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local alias -> dotted target
    body: FunctionInfo | None = None


class Project:
    """Index of the parsed files; resolves names and calls between them."""

    def __init__(self, sources: list[SourceFile]) -> None:
        self.modules: dict[str, ModuleInfo] = {}
        self.functions: list[FunctionInfo] = []
        self.classes: dict[str, ClassInfo] = {}
        self._by_qualname: dict[str, FunctionInfo] = {}
        self._callee_cache: dict[int, list[tuple[FunctionInfo, ast.Call]]] = {}
        # obj.attr = value for receivers other than self, by attribute name (other objects' attributes)
        self.attr_stores: dict[str, list[tuple[ast.expr, FunctionInfo]]] = {}
        self._calls_by_name: dict[str, list[tuple[FunctionInfo, ast.Call]]] | None = None
        self._callers: dict[int, list[tuple[FunctionInfo, ast.Call]]] = {}
        self._suffixes: dict[str, ModuleInfo | None] = {}
        for sf in sources:
            if sf.tree is not None:
                self._index_module(sf, sf.tree)
        self._link_classes()

    # ------------------------------------------------------------------ indexing
    def _index_module(self, sf: SourceFile, tree: ast.Module) -> None:
        name = sf.module
        while name in self.modules:  # two files with one module name (scripts): keep both
            name += "_"
        mod = ModuleInfo(name, sf)
        self.modules[name] = mod
        body = FunctionInfo(f"{name}.<module>", "<module>", tree, mod)
        mod.body = body
        self._walk(body, tree.body, None)

    def _new_function(self, node: FuncNode, owner: FunctionInfo, cls: ClassInfo | None) -> FunctionInfo:
        mod = owner.module
        if cls is not None:
            qual, parent = f"{cls.qualname}.{node.name}", None
        elif owner.name == "<module>":
            qual, parent = f"{mod.name}.{node.name}", None
        else:
            qual, parent = f"{owner.qualname}.<locals>.{node.name}", owner
        fn = FunctionInfo(qual, node.name, node, mod, cls, parent)
        self.functions.append(fn)
        self._by_qualname.setdefault(qual, fn)
        if cls is not None:
            cls.methods[node.name] = fn
        elif parent is None:
            mod.functions[node.name] = fn
        else:
            owner.local_defs[node.name] = fn
        self._walk(fn, node.body, None)
        for d in node.decorator_list:
            self._walk_expr(owner, d)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self._walk_expr(owner, default)
        return fn

    def _walk(self, fn: FunctionInfo, stmts: list[ast.stmt], cls: ClassInfo | None) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._new_function(stmt, fn, cls)
            elif isinstance(stmt, ast.ClassDef):
                self._new_class(stmt, fn)
            else:
                self._walk_stmt(fn, stmt, cls)

    def _new_class(self, node: ast.ClassDef, owner: FunctionInfo) -> None:
        mod = owner.module
        prefix = mod.name if owner.name == "<module>" else f"{owner.qualname}.<locals>"
        ci = ClassInfo(f"{prefix}.{node.name}", node.name, node, mod)
        self.classes.setdefault(ci.qualname, ci)
        if owner.name == "<module>":
            mod.classes[node.name] = ci
        for b in [*node.bases, *node.decorator_list]:
            self._walk_expr(owner, b)
        # Statements of the class body (not methods) belong to the enclosing code.
        self._walk(owner, node.body, ci)
        for stmt in node.body:  # dataclass-style fields: ``seq_lens: torch.Tensor`` (with its default, if any)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ci.attr_types.setdefault(stmt.target.id, stmt.annotation)
                ci.fields.append(stmt.target.id)
                if stmt.value is not None:
                    ci.attr_assigns.setdefault(stmt.target.id, []).append((stmt.value, owner))

    def _walk_stmt(self, fn: FunctionInfo, stmt: ast.stmt, cls: ClassInfo | None) -> None:
        # The hot loop of the whole verifier (every node of every file passes here once): dispatch on the exact
        # type and skip fields that never hold nodes, which is several times faster than ast.iter_child_nodes.
        stack: list[ast.AST] = [stmt]
        pop, push = stack.pop, stack.append
        while stack:
            node = pop()
            t = type(node)
            if t in _LEAVES:
                continue
            if t in _SCOPES:
                self._walk(fn, [node], cls)  # type: ignore[list-item]
                continue
            kind = _KINDS.get(t)
            if kind is not None:
                self._collect(fn, node, kind)
            for name in _child_fields(t):
                v = getattr(node, name, None)
                if type(v) is list:
                    for item in v:
                        if isinstance(item, ast.AST):
                            push(item)
                elif isinstance(v, ast.AST):
                    push(v)

    def _walk_expr(self, fn: FunctionInfo, expr: ast.expr) -> None:
        for node in ast.walk(expr):
            kind = _KINDS.get(type(node))
            if kind is not None:
                self._collect(fn, node, kind)

    def _collect(self, fn: FunctionInfo, node: Any, kind: str) -> None:
        if kind == "call":
            fn.calls.append(node)
        elif kind == "attr":
            fn.attributes.append(node)
        elif kind == "sub":
            fn.subscripts.append(node)
        elif kind == "assign":
            fn.assigns.append(node)
            if isinstance(node, ast.AugAssign) or node.value is None:
                return
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                self._record_target(fn, t, node.value)
            if isinstance(node, ast.AnnAssign):
                self._record_annotation(fn, node)
        elif kind == "assert":
            fn.asserts.append(node)
        elif kind == "test":
            fn.tests.append(node.test)
        elif kind == "import":
            self._record_import(fn.module, node)
        elif kind == "return":
            if node.value is not None:
                fn.returns.append(node.value)
        elif kind == "for":
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    fn.loop_vars.setdefault(n.id, []).append(node.iter)
        elif kind == "with":
            for item in node.items:
                c = item.context_expr
                if isinstance(c, ast.Call) and dotted(c.func) in ("torch.device", "device") and c.args:
                    fn.device_blocks.append((node.lineno, node.end_lineno or node.lineno, c.args[0]))

    def _record_target(self, fn: FunctionInfo, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            fn.local_assigns.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Attribute):
            if isinstance(target.value, ast.Name) and target.value.id == "self":
                cls = _owner(fn).cls
                if cls is not None:
                    cls.attr_assigns.setdefault(target.attr, []).append((value, fn))
            else:
                self.attr_stores.setdefault(target.attr, []).append((value, fn))
        elif isinstance(target, ast.Subscript):
            base = target.value
            if isinstance(base, ast.Name):
                fn.item_stores.setdefault(base.id, []).append(value)
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self":
                cls = _owner(fn).cls
                if cls is not None:
                    cls.item_assigns.setdefault(base.attr, []).append((value, fn))
                    key = target.slice
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):  # self.d["decode"] = ...
                        cls.item_assigns.setdefault(f"{base.attr}[{key.value!r}]", []).append((value, fn))
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._record_target(fn, t, v)

    @staticmethod
    def _record_annotation(fn: FunctionInfo, node: ast.AnnAssign) -> None:
        t = node.target
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            cls = _owner(fn).cls
            if cls is not None:
                cls.attr_types.setdefault(t.attr, node.annotation)

    def _record_import(self, mod: ModuleInfo, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    mod.imports[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    mod.imports[top] = top
            return
        base = node.module or ""
        if node.level:
            pkg = mod.name.split(".")
            is_pkg = mod.source.path.name == "__init__.py"
            keep = len(pkg) - node.level + (1 if is_pkg else 0)
            base = ".".join([*pkg[: max(keep, 0)], *([base] if base else [])])
        for a in node.names:
            if a.name != "*":
                mod.imports[a.asname or a.name] = f"{base}.{a.name}" if base else a.name

    def _link_classes(self) -> None:
        for ci in self.classes.values():
            for b in ci.node.bases:
                target = self.resolve_def(b, ci.module.body)
                if isinstance(target, ClassInfo) and target is not ci:
                    ci.bases.append(target)
                    target.subclasses.append(ci)

    # ------------------------------------------------------------------ name resolution
    def lookup(self, qualname: str, depth: int = 0) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """A definition by dotted name, following re-exports (``from .impl import f`` in a package)."""
        if depth > 8:
            return None
        if qualname in self.modules:
            return self.modules[qualname]
        if "." in qualname:
            by_suffix = self._suffix_module(qualname)
            if by_suffix is not None:
                return by_suffix
        if qualname in self.classes:
            return self.classes[qualname]
        if qualname in self._by_qualname:
            return self._by_qualname[qualname]
        head, _, last = qualname.rpartition(".")
        if not head:
            return None
        parent = self.lookup(head, depth + 1)
        return self._member(parent, last, depth + 1) if parent is not None else None

    def _member(
        self, d: FunctionInfo | ClassInfo | ModuleInfo, name: str, depth: int = 0
    ) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        if isinstance(d, ModuleInfo):
            if name in d.functions:
                return d.functions[name]
            if name in d.classes:
                return d.classes[name]
            target = d.imports.get(name)
            return self.lookup(target, depth + 1) if target else self.modules.get(f"{d.name}.{name}")
        if isinstance(d, ClassInfo):
            return self.method(d, name)
        return None

    def method(self, ci: ClassInfo, name: str) -> FunctionInfo | None:
        """`name` looked up along the project-visible bases of `ci` (depth-first, like a simple MRO)."""
        seen: set[int] = set()
        stack = [ci]
        while stack:
            c = stack.pop(0)
            if id(c) in seen:
                continue
            seen.add(id(c))
            if name in c.methods:
                return c.methods[name]
            stack.extend(c.bases)
        return None

    def resolve_def(
        self, expr: ast.expr, fn: FunctionInfo | None, depth: int = 0
    ) -> FunctionInfo | ClassInfo | ModuleInfo | None:
        """What a Name/Attribute expression refers to (a function, class or module of the project)."""
        if fn is None or depth > 6:
            return None
        if isinstance(expr, ast.Name):
            scope: FunctionInfo | None = fn
            while scope is not None:
                if expr.id in scope.local_defs:
                    return scope.local_defs[expr.id]
                scope = scope.parent
            mod = fn.module
            if expr.id in mod.functions:
                return mod.functions[expr.id]
            if expr.id in mod.classes:
                return mod.classes[expr.id]
            if expr.id in mod.imports:
                return self.lookup(mod.imports[expr.id])
            values = fn.local_assigns.get(expr.id) or []
            alias = values[0] if len(values) == 1 else None
            if isinstance(alias, ast.Attribute) or (isinstance(alias, ast.Name) and alias.id != expr.id):
                return self.resolve_def(alias, fn, depth + 1)  # alias: f = self.helper; f()
            return None
        if isinstance(expr, ast.Attribute):
            base = expr.value
            if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super":
                owner = _owner(fn).cls
                for b in owner.bases if owner is not None else []:
                    m = self.method(b, expr.attr)
                    if m is not None:
                        return m
                return None
            inst = self.instance_type(base, fn, depth + 1)
            if inst is not None:
                return self.method(inst, expr.attr)
            target = self.resolve_def(base, fn, depth + 1)
            if isinstance(target, (ModuleInfo, ClassInfo)):
                return self._member(target, expr.attr)
            if target is None and isinstance(base, ast.Name) and base.id in fn.module.imports:
                return self.lookup(f"{fn.module.imports[base.id]}.{expr.attr}")
        return None

    def instance_type(self, expr: ast.expr, fn: FunctionInfo, depth: int = 0) -> ClassInfo | None:
        """The project class an expression is an instance of, when simple facts say so."""
        if depth > 4:
            return None
        if isinstance(expr, ast.Name):
            if expr.id in ("self", "cls"):
                owner = _owner(fn)
                return owner.cls if expr.id in owner.params else None
            if expr.id in fn.params:
                return self._value_type(expr, fn, depth + 1)
            scope, values = fn, fn.local_assigns.get(expr.id, [])
            if not values and fn.module.body is not None:  # a module global, or one imported from a project module
                scope, values = fn.module.body, fn.module.body.local_assigns.get(expr.id, [])
                target = fn.module.imports.get(expr.id)
                if not values and target:
                    mod = self.lookup(target.rpartition(".")[0])
                    if isinstance(mod, ModuleInfo) and mod.body is not None:
                        scope, values = mod.body, mod.body.local_assigns.get(target.rpartition(".")[2], [])
            types = {id(t): t for v in values if (t := self._value_type(v, scope, depth)) is not None}
            return next(iter(types.values())) if len(types) == 1 else None
        if isinstance(expr, ast.Attribute):
            cls = self.instance_type(expr.value, fn, depth + 1)
            if cls is None:
                return None
            for c in [cls, *cls.bases]:
                ann = c.attr_types.get(expr.attr)
                if ann is not None and c.module.body is not None:
                    t = self._annotation_class(ann, c.module.body, depth + 1)
                    if t is not None:
                        return t
                for value, where in c.attr_assigns.get(expr.attr, []):
                    t = self._value_type(value, where, depth + 1)
                    if t is not None:
                        return t
        return None

    def _value_type(self, value: ast.expr, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if isinstance(value, ast.Call):
            target = self.resolve_def(value.func, fn, depth + 1)
            return target if isinstance(target, ClassInfo) else None
        if isinstance(value, ast.Name) and value.id in fn.params:
            if fn.params[value.id] is not None:
                return self._annotation_class(fn.params[value.id], fn, depth + 1)
            if value.id in ("self", "cls") and fn.cls is not None:
                return fn.cls
            for caller, call in self.callers(fn)[:8] if depth < 3 else []:  # filled by callers
                arg = _argument(call, fn, value.id)
                t = self.instance_type(arg, caller, depth + 1) if arg is not None else None
                if t is not None:
                    return t
        if isinstance(value, ast.Attribute | ast.Name):
            return self.instance_type(value, fn, depth + 1)
        return None

    def _annotation_class(self, ann: ast.expr | None, fn: FunctionInfo, depth: int) -> ClassInfo | None:
        if ann is None or depth > 6:
            return None
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(ann, ast.Subscript) and dotted(ann.value) in ("Optional", "typing.Optional"):
            ann = ann.slice
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            left = self._annotation_class(ann.left, fn, depth + 1)
            return left if left is not None else self._annotation_class(ann.right, fn, depth + 1)
        target = self.resolve_def(ann, fn, depth + 1) if isinstance(ann, (ast.Name, ast.Attribute)) else None
        return target if isinstance(target, ClassInfo) else None

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

    # ------------------------------------------------------------------ call graph
    def callers(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project call sites that may call `fn` (constructor calls for ``__init__``), at most 64."""
        cached = self._callers.get(id(fn))
        if cached is not None:
            return cached
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for caller in self.all_functions():
                for call in caller.calls:
                    f = call.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                    if name is not None:
                        self._calls_by_name.setdefault(name, []).append((caller, call))
        names = [fn.name]
        if fn.name == "__init__" and fn.cls is not None:
            names = [fn.cls.name, *(c.name for c in fn.cls.subclasses)]
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for name in names:
            for caller, call in self._calls_by_name.get(name, [])[:256]:
                if any(t is fn for t in self._call_targets(call, caller)):
                    out.append((caller, call))
        self._callers[id(fn)] = out[:64]
        return out[:64]

    def callees(self, fn: FunctionInfo) -> list[tuple[FunctionInfo, ast.Call]]:
        """Project functions `fn` calls, with the call node (constructors resolve to ``__init__``)."""
        cached = self._callee_cache.get(id(fn))
        if cached is not None:
            return cached
        out: list[tuple[FunctionInfo, ast.Call]] = []
        for call in fn.calls:
            for target in self._call_targets(call, fn):
                out.append((target, call))
        self._callee_cache[id(fn)] = out
        return out

    def _call_targets(self, call: ast.Call, fn: FunctionInfo) -> Iterator[FunctionInfo]:
        func = call.func
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return
        target = self.resolve_def(func, fn)
        if isinstance(target, ClassInfo):
            init = self.method(target, "__init__")
            if init is not None:
                yield init
            return
        if not isinstance(target, FunctionInfo):
            return
        yield target
        # self.method() may run an override defined in a subclass.
        is_self_call = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        if is_self_call and target.cls is not None:
            yield from self._overrides(target.cls, target.name)

    def _overrides(self, ci: ClassInfo, name: str) -> Iterator[FunctionInfo]:
        stack, seen = list(ci.subclasses), set()
        while stack:
            c = stack.pop()
            if id(c) in seen:
                continue
            seen.add(id(c))
            if name in c.methods:
                yield c.methods[name]
            stack.extend(c.subclasses)

    def all_functions(self) -> Iterator[FunctionInfo]:
        """Every function and every module's top-level code."""
        for mod in self.modules.values():
            if mod.body is not None:
                yield mod.body
        yield from self.functions


def _argument(call: ast.Call, callee: FunctionInfo, param: str) -> ast.expr | None:
    """The argument a call passes for `param` (keyword, or position after ``self``)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    if isinstance(callee.node, ast.Module):
        return None
    names = [a.arg for a in [*callee.node.args.posonlyargs, *callee.node.args.args]]
    if callee.cls is not None and names[:1] == ["self"]:
        names = names[1:]
    i = names.index(param) if param in names else len(call.args)
    return call.args[i] if i < len(call.args) else None


def _owner(fn: FunctionInfo) -> FunctionInfo:
    """The method a nested function belongs to (closures see the method's ``self``)."""
    while fn.parent is not None:
        fn = fn.parent
    return fn
