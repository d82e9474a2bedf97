"""The one walk over a file's tree that fills a `flashcheck.verifier.index.ModuleIndex`: modules, classes, functions
(a ``lambda`` kept to be called later, in a table, a hook list, an attribute or a registration, is a function of its
own, ``<lambda>``; one called where it is written, as a ``key=`` or an argument, stays part of the function around
it), and what each function body holds (calls, attributes,
assignments, asserts, branch tests, subscripts, returns, loop variables, ``with torch.device(...)`` blocks), so that
rules never re-walk the tree."""

from __future__ import annotations

import ast
from typing import Any

from flashcheck.verifier.astutil import dotted, init_field, pattern_bindings, target_paths
from flashcheck.verifier.index import ClassInfo, FuncNode, FunctionInfo, ModuleIndex, ModuleInfo, owner_of
from flashcheck.verifier.itemkeys import defaulted_items, item_keys, keyed_items_keys, keyed_store_keys
from flashcheck.verifier.module_idioms import REGISTERED
from flashcheck.verifier.source import SourceFile

__all__ = ["index_module"]

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
    ast.Global: "global",
    ast.NamedExpr: "walrus",
    ast.Match: "match",
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


# containers whose lambdas are kept for later, and calls that keep the lambdas they are handed
_HOLDERS = frozenset({ast.Dict, ast.List, ast.Tuple, ast.Set})
_KEEPS = frozenset({"append", "insert", "add", "setdefault", "put", "put_nowait"})


def index_module(sf: SourceFile, name: str | None = None) -> ModuleIndex | None:
    """Index one parsed file under module `name` (default: its own module name); None for a file that did not
    parse."""
    if sf.tree is None:
        return None
    return _Indexer(sf, sf.module if name is None else name, sf.tree).out


class _Indexer:
    """The one walk over a file's tree that fills a `ModuleIndex`."""

    def __init__(self, sf: SourceFile, name: str, tree: ast.Module) -> None:
        mod = ModuleInfo(name, sf)
        self.out = ModuleIndex(mod)
        self.attr_stores = self.out.attr_stores
        self._globals: set[str] = set()  # names the function being walked declares global
        self._kept: set[int] = set()  # lambdas kept to be called later (in a table, a hook list, an attribute)
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
        declared = self._globals
        self._globals = set()
        self.out.functions.append(fn)
        accessor = next((a for d in node.decorator_list if (a := _accessor(d, node.name))), None)
        if cls is not None and accessor is not None:
            if accessor == "setter":  # the getter keeps the name: reads run it, stores run this
                cls.setters[node.name] = fn
        elif cls is not None:
            cls.methods[node.name] = fn
        elif parent is None:
            mod.functions[node.name] = fn
        else:
            owner.local_defs[node.name] = fn
        self._walk(fn, node.body, None)
        for name in sorted(self._globals):  # global X: its assignments here are the module's
            mod.global_stores.setdefault(name, []).extend((v, fn) for v in fn.local_assigns.get(name, []))
        self._globals = declared
        for d in node.decorator_list:
            self._walk_expr(owner, d)
        self._walk_defaults(node.args, owner)
        return fn

    def _walk_defaults(self, args: ast.arguments, owner: FunctionInfo) -> None:
        """Default values, evaluated in `owner`; a ``lambda`` default (``layout_of=lambda w: w._kv_layout``) is a
        function of its own, which calls of the parameter run."""
        for default in [*args.defaults, *args.kw_defaults]:
            if isinstance(default, ast.Lambda):
                self._new_lambda(default, owner)
            elif default is not None:
                self._walk_expr(owner, default)

    def _new_lambda(self, node: ast.Lambda, owner: FunctionInfo) -> None:
        """A ``lambda`` as a function of its own, ``<lambda>``, nested in `owner` (its free names are the owner's):
        its body is what it returns; `lambda_function` finds it from the expression."""
        ret = ast.copy_location(ast.Return(value=node.body), node.body)
        fdef = ast.FunctionDef(name="<lambda>", args=node.args, body=[ret], decorator_list=[], returns=None)
        ast.copy_location(fdef, node)
        fdef.end_lineno, fdef.end_col_offset = node.end_lineno, node.end_col_offset
        mod = owner.module
        parent = owner if owner.name != "<module>" else None
        qual = f"{owner.qualname}.<locals>.<lambda>" if parent is not None else f"{mod.name}.<lambda>"
        fn = FunctionInfo(qual, "<lambda>", fdef, mod, None, parent)
        self.out.functions.append(fn)
        node._flashcheck_function = fn  # type: ignore[attr-defined]
        self._walk(fn, fdef.body, None)
        self._walk_defaults(node.args, owner)

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
        self.out.classes.append(ci)
        if owner.name == "<module>":
            mod.classes[node.name] = ci
        for b in [*node.bases, *node.decorator_list]:
            self._walk_expr(owner, b)
        # Statements of the class body (not methods) belong to the enclosing code.
        self._walk(owner, node.body, ci)
        for stmt in node.body:  # dataclass-style fields: ``seq_lens: torch.Tensor`` (with its default, if any)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ci.attr_types.setdefault(stmt.target.id, stmt.annotation)
                if init_field(stmt):
                    ci.fields.append(stmt.target.id)
                if stmt.value is not None:
                    ci.attr_assigns.setdefault(stmt.target.id, []).append((stmt.value, owner))
            elif isinstance(stmt, ast.Assign):  # class attributes (``WORKSPACE_BYTES = 128 << 20``), read as self.X
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        ci.attr_assigns.setdefault(t.id, []).append((stmt.value, owner))

    def _walk_stmt(self, fn: FunctionInfo, stmt: ast.stmt, cls: ClassInfo | None) -> None:
        # The hot loop of the whole verifier (every node of every file passes here once): dispatch on the exact
        # type and skip fields that never hold nodes, which is several times faster than ast.iter_child_nodes.
        stack: list[ast.AST] = [stmt]
        pop, push = stack.pop, stack.append
        while stack:
            node = pop()
            t = type(node)
            if t in _LEAVES:
                if t is ast.Constant and type(node.value) is str and node.value[:1] == "_":  # type: ignore[attr-defined]
                    self.out.module.private_strings.add(node.value)  # type: ignore[attr-defined]
                continue
            if t in _SCOPES:
                self._walk(fn, [node], cls)  # type: ignore[list-item]
                continue
            if t is ast.Lambda and id(node) in self._kept:
                self._new_lambda(node, fn)  # type: ignore[arg-type]
                continue
            kind = _KINDS.get(t)
            if kind is not None:
                self._collect(fn, node, kind)
            if t in _HOLDERS:  # {"decode": lambda fb: ...}, [lambda m: ...]: kept, to be called later
                for v in node.values if t is ast.Dict else node.elts:  # type: ignore[attr-defined]
                    if type(v) is ast.Lambda:
                        self._kept.add(id(v))
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
            if type(node) is ast.Constant and type(node.value) is str and node.value[:1] == "_":
                self.out.module.private_strings.add(node.value)
            kind = _KINDS.get(type(node))
            if kind is not None:
                self._collect(fn, node, kind)

    def _collect(self, fn: FunctionInfo, node: Any, kind: str) -> None:
        if kind == "call":
            fn.calls.append(node)
            f = node.func
            if type(f) is ast.Attribute and (f.attr in _KEEPS or f.attr.startswith("register")):
                for a in node.args:  # hooks.append(lambda m: ...), run.register(Meta, lambda m, b: ...)
                    if type(a) is ast.Lambda:
                        self._kept.add(id(a))
            # self.bufs.append(t), self.graphs[mb].append(w): an item store, as self.bufs[k] = t
            if (
                type(f) is ast.Attribute
                and f.attr in ("append", "insert")
                and node.args
                and type(f.value) is not ast.Name
            ):
                self._record_target(fn, ast.Subscript(f.value, ast.Constant(None)), node.args[-1])
            elif type(f) is ast.Attribute and f.attr == "setdefault" and len(node.args) == 2:
                self._record_target(fn, ast.Subscript(f.value, node.args[0]), node.args[1])  # a store, as d[k] = v
            elif type(f) is ast.Attribute and f.attr == "extend" and node.args and type(f.value) is not ast.Name:
                for item in _literal_elements(node.args[0]):  # self.layers.extend([Layer(i) for i in ...])
                    self._record_target(fn, ast.Subscript(f.value, ast.Constant(None)), item)
            elif type(f) is ast.Attribute and f.attr == "update" and node.args and type(f.value) is not ast.Name:
                added = node.args[0]  # self.heads.update({"tree": TreeHead(w)}): a store under each key
                for k, v in zip(added.keys, added.values, strict=True) if isinstance(added, ast.Dict) else ():
                    self._record_target(fn, ast.Subscript(f.value, k if k is not None else ast.Constant(None)), v)
        elif kind == "attr":
            fn.attributes.append(node)
        elif kind == "sub":
            fn.subscripts.append(node)
        elif kind == "assign":
            fn.assigns.append(node)
            if getattr(node, REGISTERED, False):  # self.register_buffer("k", torch.zeros(n)): on the module's device
                fn.device_blocks.append((node.lineno, node.end_lineno or node.lineno, ast.Constant("cuda")))
            held = [node.target] if not isinstance(node, ast.Assign) else node.targets
            if type(node.value) is ast.Lambda and any(type(t) is not ast.Name for t in held):
                self._kept.add(id(node.value))  # self.on_step = lambda b: ...: an attribute holds it
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fn.local_types.setdefault(node.target.id, node.annotation)
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and type(node.target) is not ast.Name:
                for item in _literal_elements(node.value):  # self.layers += [Layer(i)]: an item store
                    self._record_target(fn, ast.Subscript(node.target, ast.Constant(None)), item)
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
            span = (node, node) if isinstance(node, ast.For | ast.AsyncFor) else (node.target, node.iter)
            first, last = span[0].lineno, span[1].end_lineno or span[1].lineno
            for name, path in target_paths(node.target, ()):
                fn.loop_items.setdefault(name, []).append((node.iter, path, first, last))
        elif kind == "global":
            self._globals.update(node.names)
        elif kind == "walrus":  # if decode := meta.decode_metadata: a local like any other assignment
            if isinstance(node.target, ast.Name):
                fn.local_assigns.setdefault(node.target.id, []).append(node.value)
        elif kind == "match":  # case DecodeBatch(kv_indptr=indptr): indptr = subject.kv_indptr
            for name, value in (b for case in node.cases for b in pattern_bindings(node.subject, case.pattern)):
                fn.local_assigns.setdefault(name, []).append(value)
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
                cls = owner_of(fn).cls
                if cls is not None:
                    cls.attr_assigns.setdefault(target.attr, []).append((value, fn))
            else:
                self.attr_stores.setdefault(target.attr, []).append((value, fn))
        elif isinstance(target, ast.Subscript):
            target = defaulted_items(target)  # self.bufs.setdefault(mb, {})[bs] = t: self.bufs[mb][bs] = t
            base = target.value
            if isinstance(base, ast.Name):
                fn.item_stores.setdefault(base.id, []).append(value)
            elif isinstance(base, ast.Attribute) and dotted(base.value) == "self" and (cls := owner_of(fn).cls):
                cls.item_assigns.setdefault(base.attr, []).append((value, fn))
                key = target.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):  # self.d["decode"] = ...
                    cls.item_assigns.setdefault(f"{base.attr}[{key.value!r}]", []).append((value, fn))
                for dk, dv in zip(value.keys, value.values, strict=True) if isinstance(value, ast.Dict) else ():
                    if isinstance(dk, ast.Constant) and isinstance(dk.value, str):  # self.bufs[bs] = {"host": t}
                        for item_key in keyed_store_keys(target, dk.value):
                            cls.item_assigns.setdefault(item_key, []).append((dv, fn))
            elif (
                isinstance(base, ast.Subscript)
                and (keys := item_keys(base, of_self=True))
                and (cls := owner_of(fn).cls)
            ):
                key = target.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):  # self.bufs[bs]["host"] = t
                    keys = [*keys, *keyed_store_keys(base, key.value)]
                keys = [*keys, *keyed_items_keys(base)]  # self.bufs[bs]["host"][i] = t, .append(t)
                for k in keys:  # self.graphs[mb][bs] = w, self.bufs["cpu"].append(t)
                    cls.item_assigns.setdefault(k, []).append((value, fn))
                for dk, dv in zip(value.keys, value.values, strict=True) if isinstance(value, ast.Dict) else ():
                    if isinstance(dk, ast.Constant) and isinstance(dk.value, str):  # self.bufs[mb][bs] = {"host": t}
                        for item_key in keyed_store_keys(target, dk.value):
                            cls.item_assigns.setdefault(item_key, []).append((dv, fn))
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._record_target(fn, t, v)
        elif isinstance(target, (ast.Tuple, ast.List)) and (cls := owner_of(fn).cls) is not None:
            for i, t in enumerate(target.elts):  # (self.seq_lens, self.cu_seqlens) = gen_params(...)
                if isinstance(t, ast.Starred):
                    break
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    cls.attr_unpacks.setdefault(t.attr, []).append((value, i, fn))

    @staticmethod
    def _record_annotation(fn: FunctionInfo, node: ast.AnnAssign) -> None:
        t = node.target
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
            cls = owner_of(fn).cls
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
            else:  # `from ext import *`: kept under a key no name can be, for what the module may provide
                mod.imports[f"*{base}"] = base


def _accessor(d: ast.expr, name: str) -> str | None:
    """``setter``/``deleter`` for ``@name.setter``/``@name.deleter`` on a method `name` (a property's other
    accessors)."""
    if isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter"):
        return d.attr if isinstance(d.value, ast.Name) and d.value.id == name else None
    return None


def _literal_elements(value: ast.expr) -> list[ast.expr]:
    """The items of a list or tuple literal (not starred ones) or the element of a comprehension; else none."""
    if isinstance(value, ast.List | ast.Tuple):
        return [e for e in value.elts if not isinstance(e, ast.Starred)]
    if isinstance(value, ast.ListComp | ast.GeneratorExp):
        return [value.elt]
    return []
