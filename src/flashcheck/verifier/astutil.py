"""Small AST helpers shared by the verifier and its rules: dotted names, name tokens, storage keys.

Everything here is pure and cheap; rules use these instead of re-implementing name matching so that a fixture
that passes for one rule reads the same way for the others.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Container, Iterator, Mapping

__all__ = [
    "IN_PLACE_EXCEPTIONS",
    "SCOPES",
    "VIEW_METHODS",
    "annotation",
    "branches",
    "call_name",
    "dotted",
    "enclosing_tests",
    "executed_callable",
    "handoff_arguments",
    "init_field",
    "is_in_place_method",
    "item_annotation",
    "kwarg",
    "kwargs_param",
    "name_tokens",
    "overload_stub",
    "own_nodes",
    "parameters",
    "pattern_bindings",
    "positional_args",
    "reflected_attribute",
    "spread_local_tuples",
    "statement_blocks",
    "storage_root",
    "target_paths",
    "terminal_name",
]

_SPLIT = re.compile(r"[^a-zA-Z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# Methods that return a view of (or the same storage as) their receiver: a write through the result writes the base.
VIEW_METHODS = frozenset(
    {
        "view",
        "view_as",
        "narrow",
        "reshape",
        "as_strided",
        "flatten",
        "unsqueeze",
        "squeeze",
        "select",
        "expand",
        "transpose",
        "permute",
        "t",
        "unflatten",
        "detach",
        "contiguous",
        "__getitem__",
    }
)
# Methods whose name ends in "_" but that do not write their receiver.
IN_PLACE_EXCEPTIONS = frozenset({"requires_grad_", "share_memory_", "record_stream_"})


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, None for anything else (calls, subscripts...)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def is_none(node: ast.AST) -> bool:
    """The constant ``None``."""
    return isinstance(node, ast.Constant) and node.value is None


def alias_value(values: list[ast.expr]) -> ast.Name | ast.Attribute | None:
    """The name or attribute chain a global bound once (a ``None`` fallback aside) aliases: ``Decode =
    flashinfer.X`` (with ``except ImportError: Decode = None``); of a conditional one, its first branch that names
    one (``A if ragged else B``: built the same way; ``None if off else A``)."""
    held = [v for v in values if not is_none(v)]
    value = held[0] if len(held) == 1 else None
    if isinstance(value, ast.IfExp):  # the first branch that names a class (the other may be a partial of it)
        value = next((b for b in (value.body, value.orelse) if isinstance(b, ast.Name | ast.Attribute)), None)
    return value if isinstance(value, ast.Name | ast.Attribute) else None


def class_base(node: ast.expr) -> ast.expr:
    """The class a base expression names: ``Base`` of a generic ``Base[Meta]`` (``Protocol[T]``), else `node`."""
    return node.value if isinstance(node, ast.Subscript) else node


_PROTOCOLS = frozenset({"typing.Protocol", "typing_extensions.Protocol"})
_TYPING = frozenset({"typing", "typing_extensions"})


def is_abstract(node: ast.AST) -> bool:
    """Whether a method only declares itself: ``@abstractmethod`` (also ``abc.abstractmethod``), or a body (after
    its docstring) of ``...`` or ``raise NotImplementedError``. An object whose class's method is such a declaration
    runs a subclass's method when called (a body of ``pass`` is a hook that does nothing, and may run)."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    if any((dotted(d) or "").rsplit(".", 1)[-1] == "abstractmethod" for d in node.decorator_list):
        return True
    body = node.body[1:] if node.body and _is_docstring(node.body[0]) else node.body
    if len(body) != 1:
        return False
    stmt = body[0]
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return stmt.value.value is Ellipsis
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return (dotted(exc) or "").rsplit(".", 1)[-1] == "NotImplementedError"
    return False


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def is_protocol(node: ast.ClassDef, imports: dict[str, str]) -> bool:
    """Whether a class derives from ``typing.Protocol`` directly (also ``Protocol[T]``), with `imports` the module's
    (local name -> dotted target): ``Protocol`` from a project module named for typing (``eng._typing``) or a star
    import of typing counts; ``asyncio.Protocol`` and a project class named ``Protocol`` or ``*Protocol`` do not."""
    for b in node.bases:
        name = dotted(class_base(b)) or ""
        head, _, rest = name.partition(".")
        target = f"{imports.get(head, head)}{'.' if rest else ''}{rest}"
        if target in _PROTOCOLS:
            return True
        if name == "Protocol" and head in imports and "typing" in target:
            return True  # re-exported by a typing module of the project (``from eng._typing import Protocol``)
        if name == "Protocol" and head not in imports and any(imports.get(k) in _TYPING for k in imports):
            return True  # ``from typing import *``
    return False


def terminal_name(node: ast.AST) -> str | None:
    """The last identifier of an expression: ``x`` for ``x``, ``b`` for ``a.b``, the key of ``m["k"]``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return node.slice.value
        return terminal_name(node.value)
    if isinstance(node, ast.Call):
        return terminal_name(node.func)
    return None


def call_name(call: ast.Call) -> str | None:
    """The name a call is made through: ``torch.cuda.synchronize`` or ``synchronize`` for ``x.y().synchronize()``."""
    d = dotted(call.func)
    if d is not None:
        return d
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def name_words(name: str) -> list[str]:
    """Lower-case words of an identifier, in order: ``kv_indptr_cpu`` and ``kvIndptrCpu`` give ``[kv, indptr, cpu]``."""
    return [t.lower() for t in _SPLIT.split(name) if t]


def name_tokens(name: str) -> frozenset[str]:
    """The set of `name_words`: ``kv_indptr_cpu`` gives ``{kv, indptr, cpu}``."""
    return frozenset(name_words(name))


def literal_items(node: ast.expr) -> list[ast.expr]:
    """The values of a dict literal (a ``**spread`` entry's value too) or the elements of a list, tuple or set
    literal; ``[]`` for anything else."""
    if isinstance(node, ast.Dict):
        return list(node.values)
    return list(node.elts) if isinstance(node, ast.List | ast.Tuple | ast.Set) else []


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def is_in_place_method(name: str) -> bool:
    """PyTorch's convention: ``copy_``, ``fill_``, ``add_`` write their receiver; dunders do not count."""
    return name.endswith("_") and not name.startswith("_") and name not in IN_PLACE_EXCEPTIONS


def storage_root(node: ast.expr) -> ast.expr:
    """Strip slicing and view methods: ``self.buf[:bs + 1].view(-1)`` has the storage of ``self.buf``.

    A subscript with a constant string key (``meta["kv_indptr"]``) is a dict lookup, not a view, and is kept.
    """
    while True:
        named = reflected_attribute(node)
        if named is not None:  # vars(bufs)["kv_indptr"], getattr(w, "_x"): bufs.kv_indptr, w._x
            node = named
        elif isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                return node
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in VIEW_METHODS:
            node = node.func.value
        else:
            return node


# the attribute each reflective read stands for, kept with that read (an id is looked up only while its node lives)
_REFLECTED: dict[int, tuple[ast.expr, ast.Attribute]] = {}


def reflected_attribute(node: ast.expr) -> ast.Attribute | None:
    """The attribute a reflective read names, as if written out: ``getattr(w, "_x"[, d])``, ``vars(w)["_x"]``,
    ``vars(w).get("_x")`` and ``w.__dict__["_x"]`` (``.get``) are ``w._x`` (the subscripts are mostly rewritten so
    at parse already: operator_idioms)."""
    seen = _REFLECTED.get(id(node))
    if seen is not None and seen[0] is node:
        return seen[1]
    obj, name = _reflected_parts(node)
    if obj is None or name is None or not name.isidentifier():
        return None
    out = ast.Attribute(value=obj, attr=name, ctx=ast.Load())
    ast.copy_location(out, node)
    out.end_lineno, out.end_col_offset = node.end_lineno, node.end_col_offset
    _REFLECTED[id(node)] = (node, out)
    return out


def _reflected_parts(node: ast.expr) -> tuple[ast.expr | None, str | None]:
    def text(e: ast.expr) -> str | None:
        return e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None

    def namespace(e: ast.expr) -> ast.expr | None:  # vars(w) or w.__dict__: w
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "vars" and len(e.args) == 1:
            return e.args[0]
        return e.value if isinstance(e, ast.Attribute) and e.attr == "__dict__" else None

    if isinstance(node, ast.Subscript):  # where the parse-time rewrite left it (operator_idioms)
        return namespace(node.value), text(node.slice)
    if not isinstance(node, ast.Call) or not node.args:
        return None, None
    f = node.func
    if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
        return node.args[0], text(node.args[1])
    if isinstance(f, ast.Attribute) and f.attr == "get":
        return namespace(f.value), text(node.args[0])
    return None, None  # operator.attrgetter("_x")(w) is w._x from the parse on (operator_idioms)


def positional_args(call: ast.Call) -> list[ast.expr]:
    """A call's positional arguments, with ``*bufs`` spread in place where `spread_local_tuples` found it to be a
    tuple or list literal."""
    spread: list[ast.expr] | None = getattr(call, "_flashcheck_args", None)
    return spread if spread is not None else call.args


def spread_local_tuples(call: ast.Call, local_assigns: Mapping[str, list[ast.expr]], unstable: Container[str]) -> None:
    """Record `positional_args` for ``f(cfg, *bufs)`` where ``bufs`` is a local bound once to a tuple or list literal
    (``bufs = (self.kv_indptr, self.kv_indices)``) and never bound or changed otherwise (not in `unstable`: a
    parameter, a loop variable, a list stored into or grown): the arguments up to an unknown spread, which ends them."""
    out: list[ast.expr] = []
    for a in call.args:
        if not isinstance(a, ast.Starred):
            out.append(a)
            continue
        v = a.value
        bound = local_assigns.get(v.id, []) if isinstance(v, ast.Name) and v.id not in unstable else []
        if len(bound) != 1 or not isinstance(bound[0], ast.Tuple | ast.List):
            out.append(a)
            break
        if any(isinstance(e, ast.Starred) for e in bound[0].elts):
            out.append(a)
            break
        out.extend(bound[0].elts)
    call._flashcheck_args = out  # type: ignore[attr-defined]


def overload_stub(decorators: list[ast.expr]) -> bool:
    """A ``@typing.overload`` signature (not the implementation that follows it)."""
    return any(dotted(d) in ("overload", "typing.overload") for d in decorators)


def init_field(stmt: ast.AnnAssign) -> bool:
    """Whether a class-body annotation is a constructor argument of a dataclass: not a ``ClassVar[...]`` and not
    ``field(init=False)``."""
    ann = stmt.annotation.value if isinstance(stmt.annotation, ast.Subscript) else stmt.annotation
    if (ann.attr if isinstance(ann, ast.Attribute) else ann.id if isinstance(ann, ast.Name) else "") == "ClassVar":
        return False
    v = stmt.value
    return not (
        isinstance(v, ast.Call)
        and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in v.keywords)
    )


def enclosing_tests(root: ast.AST, node: ast.AST) -> list[tuple[ast.expr, bool]]:
    """The ``if`` tests that guard `node` inside `root`, outermost first, each with True when `node` sits in the
    branch the test enables (``body``) and False when in ``orelse``; empty when `node` is not guarded (or not
    inside `root`)."""
    path: list[tuple[ast.expr, bool]] = []

    def visit(stmts: list[ast.stmt]) -> bool:
        for stmt in stmts:
            if stmt is node or any(n is node for n in ast.walk(stmt)):
                if isinstance(stmt, ast.If) and stmt.test is not node and not _contains(stmt.test, node):
                    branch = any(_contains(s, node) for s in stmt.body)
                    path.append((stmt.test, branch))
                    return visit(stmt.body if branch else stmt.orelse)
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(stmt, field, None)
                    if isinstance(inner, list) and inner and visit(inner):
                        return True
                return True
        return False

    body = getattr(root, "body", None)
    if isinstance(body, list):
        visit(body)
    return path


def _contains(tree: ast.AST, node: ast.AST) -> bool:
    return any(n is node for n in ast.walk(tree))


def annotation(ann: ast.expr | None) -> ast.expr | None:
    """An annotation as an expression with ``Optional[...]`` and ``... | None`` taken off (``Optional["Metadata"]`` is
    ``Metadata``; a string annotation is parsed); None for no annotation or a string that does not parse. Unions of
    several types stay as written."""
    for _ in range(8):
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        elif isinstance(ann, ast.Subscript) and terminal_name(ann.value) == "Optional":
            ann = ann.slice
        elif isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            sides = [x for x in (ann.left, ann.right) if not (isinstance(x, ast.Constant) and x.value is None)]
            if len(sides) != 1:
                return ann
            ann = sides[0]
        else:
            return ann
    return ann


_SEQUENCES = frozenset(
    {
        "List",
        "list",
        "Sequence",
        "MutableSequence",
        "Iterable",
        "Set",
        "set",
        "FrozenSet",
        "frozenset",
        "Deque",
        "deque",
        "Tuple",
        "tuple",
    }
)
_MAPPINGS = frozenset({"Dict", "dict", "Mapping", "MutableMapping", "DefaultDict", "defaultdict", "OrderedDict"})


def item_annotation(ann: ast.expr) -> ast.expr | None:
    """The annotation of the items of a container annotation: ``X`` of ``List[X]``, ``Dict[K, X]``,
    ``Tuple[X, ...]``, ``Optional[Sequence[X]]`` (also written as a string); None for anything else."""
    found = annotation(ann)
    if not isinstance(found, ast.Subscript):
        return None
    head = (dotted(found.value) or "").rsplit(".", 1)[-1]
    args = found.slice.elts if isinstance(found.slice, ast.Tuple) else [found.slice]
    if head in _MAPPINGS and len(args) == 2:
        return args[1]
    if head in ("Tuple", "tuple") and not (len(args) == 2 and isinstance(args[1], ast.Constant)):
        return None  # Tuple[A, B]: items of different types
    return args[0] if head in _SEQUENCES and args else None


def pattern_bindings(subject: ast.expr, pattern: ast.pattern) -> list[tuple[str, ast.expr]]:
    """The names a ``case`` pattern binds, each with the expression of the subject it takes: the attribute of an
    instance of the class for ``DecodeBatch(kv_indptr=indptr)`` (``DecodeBatch().kv_indptr``: its fields' values),
    ``subject["seq_lens"]`` for ``{"seq_lens": lens}``, ``subject[1]`` for ``(kind, payload)``, the subject itself for
    ``as name`` and a capture; nested patterns go deeper."""

    def at(node: ast.expr) -> ast.expr:
        return ast.copy_location(node, pattern)

    if isinstance(pattern, ast.MatchAs):
        inner = pattern_bindings(subject, pattern.pattern) if pattern.pattern is not None else []
        return inner + ([(pattern.name, subject)] if pattern.name else [])
    if isinstance(pattern, ast.MatchOr):
        return [b for p in pattern.patterns for b in pattern_bindings(subject, p)]
    if isinstance(pattern, ast.MatchClass):  # the subject is an instance of the class: read as `DecodeBatch().attr`
        typed = at(ast.Call(pattern.cls, [], []))
        pairs = zip(pattern.kwd_attrs, pattern.kwd_patterns, strict=True)
        return [b for a, p in pairs for b in pattern_bindings(at(ast.Attribute(typed, a, ast.Load())), p)]
    if isinstance(pattern, ast.MatchMapping):
        out = [
            b
            for k, p in zip(pattern.keys, pattern.patterns, strict=True)
            for b in pattern_bindings(at(ast.Subscript(subject, k, ast.Load())), p)
        ]
        return out + ([(pattern.rest, subject)] if pattern.rest else [])
    if isinstance(pattern, ast.MatchSequence):
        star = next((i for i, p in enumerate(pattern.patterns) if isinstance(p, ast.MatchStar)), None)
        before = pattern.patterns[:star]  # positions past a star shift with the subject's length
        items = [at(ast.Subscript(subject, ast.Constant(i), ast.Load())) for i in range(len(before))]
        return [b for item, p in zip(items, before, strict=True) for b in pattern_bindings(item, p)]
    return []


def target_paths(target: ast.expr, path: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The names a loop target binds, each with its position in the (nested) tuple target."""
    if isinstance(target, ast.Name):
        return [(target.id, path)]
    if isinstance(target, ast.Tuple | ast.List):
        return [p for i, e in enumerate(target.elts) for p in target_paths(e, (*path, i))]
    return []


def executed_callable(call: ast.expr) -> ast.expr | None:
    """The function an awaited hand-off runs on a thread: ``f`` of ``loop.run_in_executor(pool, f, *args)`` and of
    ``asyncio.to_thread(f, *args)``; the ``await`` gives its result."""
    if not isinstance(call, ast.Call):
        return None
    at = {"run_in_executor": 1, "to_thread": 0}.get(terminal_name(call.func) or "")
    return call.args[at] if at is not None and len(call.args) > at else None


SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """`node` and the nodes below it that belong to its own scope (not those of nested functions, lambdas and
    classes)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(c for c in ast.iter_child_nodes(n) if not isinstance(c, SCOPES))


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[ast.arg]:
    """Every parameter of a function: positional-only, positional and keyword-only ones, then ``*args`` and
    ``**kw``."""
    a = node.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]


def statement_blocks(st: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists nested directly in `st`: its body, ``else`` and ``finally``, each handler's and each
    ``case``'s body."""
    out: list[list[ast.stmt]] = []
    for field in ("body", "orelse", "finalbody"):
        block = getattr(st, field, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            out.append(block)
    out.extend(h.body for h in getattr(st, "handlers", []) or [])
    out.extend(c.body for c in getattr(st, "cases", []) or [])
    return out


_HANDOFFS = frozenset({"reduce", "functools.reduce", "map", "filter"})
_PARTIAL_NAMES = frozenset({"partial", "functools.partial"})


def handoff_arguments(call: ast.Call, param: str, positional: list[str]) -> ast.expr | None:
    """The value a hand-off passes for parameter `param` of the function it is handed (whose positional parameters,
    ``self`` left out, are `positional`): ``functools.reduce(f, xs, init)`` calls ``f(acc, item)`` (the accumulator
    starts as `init`), ``map(f, xs, ys)`` calls ``f(x, y)`` and ``filter(f, xs)`` calls ``f(x)``, each after what a
    ``functools.partial(f, a, k=v)`` binds; an item of a container is written ``xs[...]``. None where `call` is no
    hand-off, or passes nothing known for `param`."""
    name = dotted(call.func)
    if name not in _HANDOFFS or len(call.args) < 2 or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    handed, bound = call.args[0], []
    if isinstance(handed, ast.Call) and dotted(handed.func) in _PARTIAL_NAMES and handed.args:
        for kw in handed.keywords:
            if kw.arg == param:
                return kw.value
        bound = handed.args[1:]
    items = [_item(c) for c in call.args[1:]]
    if name.endswith("reduce"):
        items = [call.args[2] if len(call.args) > 2 else items[0], items[0]]
    passed = [*bound, *items]
    i = positional.index(param) if param in positional else len(passed)
    return passed[i] if i < len(passed) else None


def _item(container: ast.expr) -> ast.expr:
    """``container[...]``, made once per container and kept on it (caches keyed by node stay right)."""
    made: ast.expr | None = container.__dict__.get("_flashcheck_item")
    if made is None:
        made = container.__dict__["_flashcheck_item"] = ast.copy_location(
            ast.Subscript(container, ast.Constant(...), ast.Load()), container
        )
    return made


def branches(value: ast.expr) -> list[ast.expr]:
    """The values a conditional expression may take (``weakref.ref(m) if m is not None else None``), else itself."""
    if isinstance(value, ast.IfExp):
        return [*branches(value.body), *branches(value.orelse)]
    return [value]


def kwargs_param(name: str, node: ast.AST) -> bool:
    """`name` is the ``**kwargs`` parameter of the function `node`."""
    args = getattr(node, "args", None)
    return isinstance(args, ast.arguments) and args.kwarg is not None and args.kwarg.arg == name
