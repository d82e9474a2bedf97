"""The project index's data model: modules, classes, functions, and what each function body holds (calls,
attributes, assignments, asserts, branch tests, subscripts, returns, loop variables, ``with torch.device(...)``
blocks), filled by one walk over every file (`flashcheck.verifier.indexer`), so that rules never re-walk the tree.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from flashcheck.verifier.astutil import overload_stub, parameters
from flashcheck.verifier.source import SourceFile

__all__ = [
    "POST_INITS",
    "ClassInfo",
    "FuncNode",
    "FunctionInfo",
    "Loop",
    "ModuleIndex",
    "ModuleInfo",
    "ProjectIndex",
    "descendants",
    "field_order",
    "lambda_function",
    "owner_of",
    "positional_names",
    "store_receiver",
    "through_class",
    "with_bases",
]

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef
Def = "FunctionInfo | ClassInfo | ModuleInfo"


Loop = tuple[ast.expr, tuple[int, ...], int, int]  # FunctionInfo.loop_items: iterable, position, first, last line


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
    # for/comprehension target -> (iterable, position of the name in a tuple target: ``for i, (a, b) in ...`` binds
    # b at (1, 1), first and last line of the loop); `loop_containers` reads it
    loop_items: dict[str, list[Loop]] = field(default_factory=dict)
    item_stores: dict[str, list[ast.expr]] = field(default_factory=dict)  # name[k] = value (containers)
    device_blocks: list[tuple[int, int, ast.expr]] = field(default_factory=list)  # with torch.device(d): lines
    local_types: dict[str, ast.expr] = field(default_factory=dict)  # meta: Optional[Metadata] = ... (annotation)

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
        return {p.arg: p.annotation for p in parameters(self.node)}

    @property
    def decorators(self) -> list[ast.expr]:
        return [] if isinstance(self.node, ast.Module) else list(self.node.decorator_list)

    @property
    def short(self) -> str:
        """``Class.method`` or ``function``: the name a reader recognises (a kept ``lambda``: ``Class.method.<lambda>``,
        after the function it is written in)."""
        if self.name == "<lambda>" and self.parent is not None:
            return f"{self.parent.short}.<lambda>"
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
    setters: dict[str, FunctionInfo] = field(default_factory=dict)  # @x.setter methods (``methods`` keeps the getter)
    # (self.a, self.b) = value: attr -> (value, position in it, the method)
    attr_unpacks: dict[str, list[tuple[ast.expr, int, FunctionInfo]]] = field(default_factory=dict)


@dataclass(eq=False)
class ModuleInfo:
    name: str
    source: SourceFile
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    imports: dict[str, str] = field(default_factory=dict)  # local alias -> dotted target
    body: FunctionInfo | None = None
    # global X; X = value in a function (a lazily initialised module global), with that function
    global_stores: dict[str, list[tuple[ast.expr, FunctionInfo]]] = field(default_factory=dict)
    # a name imported from a project module that binds it to a FlashInfer class there, with that class's dotted
    # name (``from .api import Decode`` after ``Decode = flashinfer.X`` in ``api``); filled when the project links
    class_aliases: dict[str, ast.expr] = field(default_factory=dict)
    # the string constants of the file that start with an underscore (``'_plan_info'``): names getattr may read
    private_strings: set[str] = field(default_factory=set)

    def global_values(self, name: str) -> list[tuple[ast.expr, FunctionInfo]]:
        """What module global `name` may hold: its top-level assignments and those of functions that declare it
        ``global``, each with the code that assigns it."""
        body = self.body
        top = body.local_assigns.get(name) if body is not None else None
        late = self.global_stores.get(name)
        out = [(v, body) for v in top] if top and body is not None else []
        return out + late if late else out


@dataclass(eq=False)
class ModuleIndex:
    """What indexing one file gives, before it joins a project: its module, its functions and classes in the order
    of the walk, and the stores into attributes of other objects (``obj.attr = value``) by attribute name.

    It depends only on the file's text, its module name and whether it is a package's ``__init__.py``, so the
    summary cache can keep it (`flashcheck.verifier.frontend`)."""

    module: ModuleInfo
    functions: list[FunctionInfo] = field(default_factory=list)
    classes: list[ClassInfo] = field(default_factory=list)
    attr_stores: dict[str, list[tuple[ast.expr, FunctionInfo]]] = field(default_factory=dict)


class ProjectIndex:
    """The parsed files, indexed (`Project` adds name resolution and the call graph).

    `indexed`, when given, holds each source's `ModuleIndex` (None for a file that does not parse), built
    elsewhere under the source's own module name; otherwise every file is indexed here."""

    def __init__(self, sources: list[SourceFile], indexed: list[ModuleIndex | None] | None = None) -> None:
        from flashcheck.verifier.indexer import index_module  # the walk builds this module's model

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
        self.by_module: dict[str, list[FunctionInfo]] = {}  # module name -> its functions and top-level code
        for i, sf in enumerate(sources):
            if sf.tree is None:
                continue
            name = sf.module
            while name in self.modules:  # two files with one module name (scripts): keep both
                name += "_"
            mi = indexed[i] if indexed is not None else None
            if mi is None or mi.module.name != name:
                mi = index_module(sf, name)
                assert mi is not None
            self._add(mi)

    def release(self) -> None:
        """Empty every module, class and function of the model, once nothing reads it any more. They refer to one
        another in cycles and hold every tree, so freeing them would otherwise wait for the cyclic garbage
        collector, which visits each node of each tree (4 s on torch's sources); emptied, they and the trees are
        freed as soon as the last reference goes."""
        everything: list[Any] = [*self.functions, *self.classes.values()]
        for mod in self.modules.values():
            everything.extend((mod, *mod.classes.values()))
            if mod.body is not None:
                everything.append(mod.body)
        for obj in everything:
            obj.__dict__.clear()

    def _add(self, mi: ModuleIndex) -> None:
        mod = mi.module
        self.modules[mod.name] = mod
        self.by_module[mod.name] = [b for b in (mod.body,) if b is not None] + mi.functions
        for fn in mi.functions:
            self.functions.append(fn)
            first = self._by_qualname.setdefault(fn.qualname, fn)
            if overload_stub(first.decorators) and not overload_stub(fn.decorators):  # the implementation
                self._by_qualname[fn.qualname] = fn
        for ci in mi.classes:
            self.classes.setdefault(ci.qualname, ci)
        for attr, stores in mi.attr_stores.items():
            self.attr_stores.setdefault(attr, []).extend(stores)


# what a generated constructor (a dataclass's, an attrs class's) calls after setting the fields
POST_INITS = ("__post_init__", "__attrs_post_init__")


def lambda_function(node: ast.expr) -> FunctionInfo | None:
    """The function the index made of a ``lambda`` expression."""
    found: FunctionInfo | None = getattr(node, "_flashcheck_function", None)
    return found if isinstance(node, ast.Lambda) else None


def owner_of(fn: FunctionInfo) -> FunctionInfo:
    """The method a nested function belongs to (closures see the method's ``self``)."""
    while fn.parent is not None:
        fn = fn.parent
    return fn


def with_bases(cls: ClassInfo | None) -> list[ClassInfo]:
    """`cls` and its project-visible bases (each once, at most 32)."""
    return _closure([cls] if cls is not None else [], lambda c: c.bases)


def derives(cls: ClassInfo, base: ClassInfo) -> bool:
    """Whether `cls` is `base` or derives from it."""
    return any(b is base for b in with_bases(cls))


def descendants(cls: ClassInfo) -> list[ClassInfo]:
    """The project classes derived from `cls`, directly or not (each once, at most 32)."""
    return [c for c in _closure(list(cls.subclasses), lambda c: c.subclasses) if c is not cls]


def _closure(start: list[ClassInfo], step: Callable[[ClassInfo], list[ClassInfo]]) -> list[ClassInfo]:
    out: list[ClassInfo] = []
    stack = start
    while stack and len(out) < 32:
        c = stack.pop()
        if c not in out:
            out.append(c)
            stack.extend(step(c))
    return out


def field_order(cls: ClassInfo) -> list[str]:
    """A dataclass's fields in the order its generated ``__init__`` takes them: the bases' fields first."""
    order: list[str] = []
    for c in reversed(with_bases(cls)):
        order.extend(f for f in c.fields if f not in order)
    return order


def through_class(call: ast.Call, callee: FunctionInfo) -> bool:
    """``Base.method(self, ...)``: a method called on its class (or a subclass), which passes ``self`` itself."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id[:1].isupper()):
        return False
    family = [*with_bases(callee.cls)]
    family.extend(c for base in list(family) for c in base.subclasses)
    return any(c.name == f.value.id for c in family)


def positional_names(fn: FunctionInfo) -> list[str]:
    """`fn`'s positional parameters that a call fills (``self``/``cls`` of a method left out)."""
    node = fn.node
    if isinstance(node, ast.Module):
        return []
    names = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    return names[1:] if fn.cls is not None and names[:1] in (["self"], ["cls"]) else names


def store_receiver(fn: FunctionInfo, value: ast.expr, attr: str) -> ast.expr | None:
    """The object `fn` stores `value` on as its attribute `attr` (``layer.attn`` of ``layer.attn.backend =
    backend``, also an item of a tuple assignment), or None."""
    for a in fn.assigns:
        if isinstance(a, ast.AugAssign) or a.value is None:
            continue
        pairs = [(t, a.value) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])]
        for t, v in pairs:
            if isinstance(t, ast.Tuple | ast.List) and isinstance(v, ast.Tuple | ast.List):
                pairs.extend(zip(t.elts, v.elts, strict=False))
            elif v is value and isinstance(t, ast.Attribute) and t.attr == attr:
                return t.value
    return None
