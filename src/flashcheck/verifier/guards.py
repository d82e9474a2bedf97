"""Branches a call's constant arguments rule out in the function it calls.

``_dummy_run(..., skip_eplb=True)`` from a capture root never reaches ``if not skip_eplb: self.eplb_step()``, and
``prepare(batch, for_capture=False)`` never runs the body of ``if for_capture:``. The hot-path walk
(`flashcheck.verifier.hotpath`) binds the literal arguments of a call (``True``, ``False``, ``None``, numbers and
strings; a parameter of the caller that is itself bound passes its value on) to the callee's parameters and leaves
out the calls inside the branches that those values decide against, and the statements after an ``if`` that
returns or raises whenever its test holds; rules leave out sites there when every path to the function does. A
parameter the callee binds again in any way (assignment, unpacking, ``+=``, a loop, ``with``, ``except`` or ``match``
target) is not bound, and neither are arguments through an alias or ``functools.partial``. Tests it reads: the
parameter itself, ``not``, ``and``/``or``, and one comparison of the parameter with a constant (``==``, ``!=``,
``in`` a literal tuple; ``is``/``is not`` only with ``None``, ``True`` or ``False``; ``<``, ``<=``, ``>``, ``>=``
between numbers). An enum member (``ForwardMode.DECODE``) is bound as a `Member`: only comparisons with members decide
a test on it, and a method of its class that only tests ``self`` (``is_decode()``) is bound by what it gives for it
(``fb.forward_mode.is_decode()``). The constant keyword fields of an
object the caller builds and hands over are bound as ``fb.use_graph`` (the capture root's ``Batch(...,
use_graph=True)``, also returned by a project function or built by ``cls(...)`` in a classmethod), and tests read them
like parameters; a callee that stores the field does not get it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flashcheck.verifier.astutil import terminal_name
from flashcheck.verifier.dataflow import arg_for_param
from flashcheck.verifier.index import ClassInfo, FunctionInfo, with_bases
from flashcheck.verifier.members import classmethod_class

__all__ = [
    "UNKNOWN",
    "Bindings",
    "Dead",
    "Guards",
    "Handed",
    "Member",
    "bind_count",
    "bound_key",
    "bound_value",
    "member",
]

Bindings = frozenset[tuple[str, object]]
_UNKNOWN = object()
UNKNOWN = _UNKNOWN  # what `bound_value` gives for a value no binding decides


@dataclass(frozen=True)
class Handed:
    """The functions a callable parameter may be on this path (``attend`` handed down from the capture's
    ``model(..., attend, attend_window)``): a call of the parameter runs only those."""

    ids: frozenset[int]


@dataclass(frozen=True)
class Member:
    """An enum member a call passes (``ForwardMode.DECODE``, of a project class derived from ``Enum``), by the names
    of its class and of itself. Only a member spelled with the same class name decides a test against it (an alias of
    the class, another class, or a number an ``IntEnum`` member may equal leave the test undecided)."""

    enum: str
    name: str


def member(expr: ast.expr) -> Member | None:
    """The member ``ForwardMode.DECODE`` (also ``fb_mod.ForwardMode.DECODE``) spells: an upper-case attribute of a
    capitalised name; else None."""
    if not (isinstance(expr, ast.Attribute) and expr.attr.isupper()):
        return None
    base = expr.value
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return Member(name, expr.attr) if name[:1].isupper() and not name.isupper() else None


class Dead:
    """The source spans of a function's statements that never run under some bindings; ``node in dead`` for a
    node of that function."""

    __slots__ = ("spans",)

    def __init__(self, spans: tuple[tuple[int, int, int, int], ...] = ()) -> None:
        self.spans = spans

    def __contains__(self, node: ast.AST) -> bool:
        if not self.spans:
            return False
        at = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        return any((a, b) <= at < (c, d) for a, b, c, d in self.spans)


_EMPTY = Dead()


class Guards:
    """Per project: which parameters of a function can decide its branches, and which nodes a binding rules out."""

    def __init__(
        self,
        used_as_value: Callable[[FunctionInfo], bool],
        resolve: Callable[[ast.expr, FunctionInfo], object] | None = None,
        callables: Callable[[ast.expr, FunctionInfo], list[FunctionInfo]] | None = None,
        stored: Callable[[], frozenset[str]] | None = None,
    ) -> None:
        self._stored = stored  # attribute names some code stores after construction (never bound as fields)
        self._built_fields: dict[tuple[int, str], list[tuple[str, object]]] = {}
        self._field_stores: dict[int, frozenset[str]] = {}  # "fb.use_graph" stored in a callee, by id(callee)
        self._used_as_value = used_as_value  # `Project.used_as_value`
        self._callables = callables  # `Project.callables`: what a callable argument may run
        self._resolve = resolve  # `Project.resolve_def`: a builder's constant fields (fb = self._static_batch(bs))
        self._names: dict[int, tuple[frozenset[str], frozenset[str]]] = {}
        self._rebound: dict[int, set[str]] = {}
        self._dead: dict[tuple[int, Bindings], Dead] = {}

    def bindings(
        self, call: ast.Call, callee: FunctionInfo, outer: Mapping[str, object], caller: FunctionInfo | None = None
    ) -> Bindings:
        """The callee's parameters that `call` fills with a constant (or with a bound parameter of the caller,
        whose values are `outer`), of those that can decide what the callee runs (`_guard_names`), and the constant
        fields of an object handed over (``fb = ForwardBatch(..., use_graph=True)`` in the caller binds
        ``fb.use_graph`` of the callee's parameter, also handed on); none for a function whose name is also used as
        a value (handed to a call, kept in a table), which may run with other arguments through calls the walk does
        not see."""
        tested, passed = self._guard_names(callee)
        called = self._called(callee)
        used = tested | passed | called
        if not used:
            return frozenset()
        found: set[tuple[str, object]] = set()
        for p in used:
            arg = arg_for_param(call, callee, p)
            if arg is None:
                continue
            v = _value(arg, outer)
            handing = v is _UNKNOWN and (p in called or p in passed) and self._callables is not None
            if handing and caller is not None and self._callables is not None and self._only_functions(arg, caller):
                made = self._callables(arg, caller)  # attend = make_attend(w): the closure the call hands over
                v = Handed(frozenset(id(f) for f in made)) if made else _UNKNOWN
            if v is not _UNKNOWN:
                found.add((p, v))
            if isinstance(v, Member) and not isinstance(arg, ast.Name):  # forward_mode=ForwardMode.DECODE: also
                facts = self._member_facts(arg, caller, v)  # what is_decode() gives; None: no enum's member
                if facts is None:
                    found.discard((p, v))
                    continue
                found.update((f"{p}.{m}", mv) for m, mv in facts)
            elif (v is _UNKNOWN or isinstance(v, Member)) and isinstance(arg, ast.Name):
                found.update((f"{p}.{f}", fv) for f, fv in self._fields(arg.id, caller, outer))
        if not found or self._used_as_value(callee):
            return frozenset()
        rebound = self._rebound.get(id(callee))
        if rebound is None:
            rebound = self._rebound[id(callee)] = _rebound(callee, set(used))
        stored = self._field_stores.get(id(callee))
        if stored is None:  # fb.use_graph = False in the callee: its own value from there on
            stored = self._field_stores[id(callee)] = frozenset(
                f"{a.value.id}.{a.attr}"
                for a in callee.attributes
                if not isinstance(a.ctx, ast.Load) and isinstance(a.value, ast.Name)
            )
        return frozenset((p, v) for p, v in found if p.partition(".")[0] not in rebound and p not in stored)

    def useful(self, fn: FunctionInfo, bound: Bindings, dead: Dead) -> Bindings:
        """`bound` without what can change nothing: with no branch ruled out, only what `fn` passes on."""
        if dead.spans or not bound:
            return bound
        kept = self._guard_names(fn)[1] | self._called(fn)
        return frozenset((p, v) for p, v in bound if p.partition(".")[0] in kept)

    def dead(self, fn: FunctionInfo, bound: Bindings) -> Dead:
        """The parts of `fn` that never run when its parameters hold `bound`."""
        if not bound:
            return _EMPTY
        key = (id(fn), bound)
        found = self._dead.get(key)
        if found is None:
            found = self._dead[key] = dead_nodes(fn, bound)
        return found

    def _fields(self, name: str, caller: FunctionInfo | None, outer: Mapping[str, object]) -> list[tuple[str, object]]:
        """The constant fields of the object a caller's local or parameter `name` holds: the constant keywords of
        the constructor call that builds it (``ForwardBatch(..., use_graph=True)``, also the one a project function
        returns: ``fb = self._static_batch(bs)``), or the fields the caller's own bindings give its parameter (handed
        on). Only a local the caller binds once, by that assignment, to a class whose constructor keeps its keywords
        as they are (a generated one, or ``self.f = f``), and only fields no code stores after construction (the
        caller's ``fb.use_graph = False``, a helper's ``batch.use_graph = ...``, a ``setattr``)."""
        prefix = name + "."
        handed = [(k[len(prefix) :], v) for k, v in outer.items() if k.startswith(prefix)]
        if handed or caller is None or name in caller.params or self._resolve is None or self._stored is None:
            return handed
        key = (id(caller), name)  # what the caller's own code builds: the same for every path through it
        found = self._built_fields.get(key)
        if found is None:
            found = self._built_fields[key] = self._constructed_fields(name, caller)
        return found

    def _constructed_fields(self, name: str, caller: FunctionInfo) -> list[tuple[str, object]]:
        """`_fields` of a local the caller builds (memoised per caller and name)."""
        assert self._resolve is not None and self._stored is not None
        values = caller.local_assigns.get(name, [])
        if len(values) != 1 or not isinstance(values[0], ast.Call):
            return []
        built = values[0]
        made = self._resolve(built.func, caller)
        if isinstance(made, FunctionInfo):  # def _static_batch(...): return ForwardBatch(..., use_graph=True)
            ret = made.returns[0] if len(made.returns) == 1 else None
            built = ret if isinstance(ret, ast.Call) else built
            if isinstance(ret, ast.Call) and isinstance(ret.func, ast.Name) and ret.func.id == "cls":
                made = classmethod_class(made)  # return cls(..., is_decode=True) in a classmethod
            else:
                made = self._resolve(ret.func, made) if isinstance(ret, ast.Call) else None
        if not isinstance(made, ClassInfo):
            return []  # only a constructor's keywords are the object's fields
        if not any(kw.arg is not None and _value(kw.value, {}) is not _UNKNOWN for kw in built.keywords):
            return []  # no constant keyword: nothing to bind (before the costlier tests below)
        if bind_count(caller, name) != 1:
            return []  # bound again (a loop, an unpacking): the object may be another one
        init = made.methods.get("__init__") or next(
            (b.methods["__init__"] for b in made.bases if "__init__" in b.methods), None
        )
        stored = self._stored()
        out = []
        for kw in built.keywords:
            v = _value(kw.value, {}) if kw.arg is not None else _UNKNOWN
            if v is _UNKNOWN or kw.arg is None or kw.arg in stored or _stores_field(caller, name, kw.arg):
                continue
            facts = self._member_facts(kw.value, caller, v) if isinstance(v, Member) else []
            if (init is None or _keeps(init, kw.arg)) and facts is not None:
                out.append((kw.arg, v))  # forward_mode=ForwardMode.DECODE: fb.forward_mode.is_decode() too
                out += [(f"{kw.arg}.{m}", mv) for m, mv in facts]
        return out

    def _member_facts(
        self, expr: ast.expr, where: FunctionInfo | None, value: Member
    ) -> list[tuple[str, object]] | None:
        """`member_methods` of the enum class `expr` (``ForwardMode.DECODE``) names, resolved where it is written;
        None where that is no project class derived from ``Enum`` (``Config.MAX_BS``: not bound)."""
        if self._resolve is None or where is None or not isinstance(expr, ast.Attribute):
            return None
        cls = self._resolve(expr.value, where)
        if not isinstance(cls, ClassInfo) or not any(
            terminal_name(b) in _ENUMS for c in with_bases(cls) for b in c.node.bases
        ):
            return None
        return member_methods(cls, value)

    def _only_functions(self, arg: ast.expr, caller: FunctionInfo) -> bool:
        """Whether every value a handed callable may be is a function the caller (or an enclosing function) makes:
        a ``lambda``, a nested ``def``, or a local bound once to a factory whose every return is one of those (not
        a parameter, which passes on what the caller was handed; not an object whose ``__call__`` runs, nor a
        registry pick, which the callee's own edges resolve better)."""
        if isinstance(arg, ast.IfExp):
            return self._only_functions(arg.body, caller) and self._only_functions(arg.orelse, caller)
        if isinstance(arg, ast.Lambda) or not isinstance(arg, ast.Name) or self._resolve is None:
            return isinstance(arg, ast.Lambda)
        scope: FunctionInfo | None = caller
        while scope is not None and arg.id not in scope.local_defs and arg.id not in scope.local_assigns:
            if arg.id in scope.params:
                return False
            scope = scope.parent
        if scope is None or arg.id in scope.local_defs:
            return scope is not None
        values = scope.local_assigns[arg.id]
        made = self._resolve(values[0].func, scope) if len(values) == 1 and isinstance(values[0], ast.Call) else None
        if not isinstance(made, FunctionInfo) or not made.returns:
            return isinstance(values[0], ast.Lambda) if len(values) == 1 else False
        return all(
            isinstance(r, ast.Lambda) or (isinstance(r, ast.Name) and r.id in made.local_defs) for r in made.returns
        )

    def _called(self, fn: FunctionInfo) -> frozenset[str]:
        """Parameters of `fn` that it calls (``attend(q, k, v)``): a callable argument decides what runs."""
        return (
            frozenset(c.func.id for c in fn.calls if isinstance(c.func, ast.Name) and c.func.id in fn.params)
            if self._callables is not None
            else frozenset()
        )

    def _guard_names(self, fn: FunctionInfo) -> tuple[frozenset[str], frozenset[str]]:
        """Parameters of `fn` that a test (``if``, ``while``, a conditional expression) reads, and those a call
        passes on as an argument: the only ones whose constant value can change what `fn` runs (those `fn` binds
        again are left out where a call binds them, `_rebound`)."""
        found = self._names.get(id(fn))
        if found is None:
            params = fn.params
            tested = {n.id for t in fn.tests for n in ast.walk(t) if isinstance(n, ast.Name) and n.id in params}
            looked_up: list[ast.expr] = [  # the key of a table a call picks from, self.handlers[fb.mode](q), also
                c.func if isinstance(c.func, ast.Subscript) else fn.local_assigns[c.func.id][0]  # through a local
                for c in fn.calls
                if isinstance(c.func, ast.Subscript)
                or (isinstance(c.func, ast.Name) and len(fn.local_assigns.get(c.func.id, [])) == 1)
            ]
            passed = {  # `tables.ruled_out_by_key` reads them
                n.id
                for sub in looked_up
                if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Attribute)
                for n in ast.walk(sub.slice)
                if isinstance(n, ast.Name) and n.id in params
            }
            for call in fn.calls:
                args = [*call.args, *(k.value for k in call.keywords)]
                args += [b for a in args if isinstance(a, ast.IfExp) for b in (a.body, a.orelse)]  # a if c else b
                passed.update(a.id for a in args if isinstance(a, ast.Name) and a.id in params)
            found = self._names[id(fn)] = (frozenset(tested), frozenset(passed))
        return found


def _rebound(fn: FunctionInfo, names: set[str]) -> set[str]:
    """Those of `names` that `fn`'s own code binds anywhere (not only by plain assignment); every one at a module's
    top level, which any code may bind again."""
    if isinstance(fn.node, ast.Module):
        return set(names)
    counts = binding_counts(fn)
    return {n for n in names if n in counts}


def bind_count(fn: FunctionInfo, name: str) -> int:
    """How many times `fn`'s own code binds `name` (`binding_counts`; more than once at a module's top level)."""
    return 2 if isinstance(fn.node, ast.Module) else binding_counts(fn).get(name, 0)


def binding_counts(fn: FunctionInfo) -> dict[str, int]:
    """How many times `fn`'s own code binds each name: assignments, loop, ``with``, ``except`` and ``match``
    targets, unpacking, ``global``/``nonlocal``, and the parameters of a ``lambda`` inside it (which shadow the
    function's there)."""
    counts: dict[str, int] = {}

    def add(name: str) -> None:
        counts[name] = counts.get(name, 0) + 1

    stack: list[ast.AST] = list(getattr(fn.node, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Lambda):
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                add(arg.arg)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            add(node.id)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            add(node.rest)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for n in node.names:
                add(n)
        stack.extend(ast.iter_child_nodes(node))
    return counts


def _stores_field(fn: FunctionInfo, name: str, field: str) -> bool:
    """``name.field = ...`` (or ``del``, ``+=``) in `fn`."""
    return any(
        a.attr == field and isinstance(a.value, ast.Name) and a.value.id == name and not isinstance(a.ctx, ast.Load)
        for a in fn.attributes
    )


def _keeps(init: FunctionInfo, field: str) -> bool:
    """Whether a constructor stores its parameter `field` as it is: ``self.field = field``."""
    for a in init.assigns:
        if not isinstance(a, ast.Assign) or not (isinstance(a.value, ast.Name) and a.value.id == field):
            continue
        if any(isinstance(t, ast.Attribute) and t.attr == field for t in a.targets):
            return True
    return False


def _value(arg: ast.expr, outer: Mapping[str, object]) -> object:
    if isinstance(arg, ast.IfExp):  # attend_window if layer.is_window else attend: either of the handed callables
        a, b = _value(arg.body, outer), _value(arg.orelse, outer)
        return Handed(a.ids | b.ids) if isinstance(a, Handed) and isinstance(b, Handed) else _UNKNOWN
    if isinstance(arg, ast.Constant) and isinstance(arg.value, bool | int | float | str | type(None)):
        return arg.value
    if isinstance(arg, ast.Name):
        return outer.get(arg.id, _UNKNOWN)
    found = member(arg)
    return found if found is not None else _UNKNOWN


def dead_nodes(fn: FunctionInfo, bindings: Bindings) -> Dead:
    """The parts of `fn` that never run when its parameters hold `bindings`."""
    if not bindings or isinstance(fn.node, ast.Module):
        return _EMPTY
    dead: list[tuple[int, int, int, int]] = []
    _block(fn.node.body, dict(bindings), dead)
    return Dead(tuple(dead)) if dead else _EMPTY


def _block(body: list[ast.stmt], env: dict[str, object], dead: list[tuple[int, int, int, int]]) -> None:
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue  # their own calls belong to their own FunctionInfo
        if isinstance(stmt, ast.If):
            truth = _truth(stmt.test, env)
            taken, skipped = (stmt.body, stmt.orelse) if truth is True else (stmt.orelse, stmt.body)
            if truth is None:
                _block(stmt.body, env, dead)
                _block(stmt.orelse, env, dead)
                continue
            _mark(skipped, dead)
            _block(taken, env, dead)
            if taken and _exits(taken[-1]):
                _mark(body[i + 1 :], dead)
                return
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                _block(inner, env, dead)
        for handler in getattr(stmt, "handlers", ()):
            _block(handler.body, env, dead)
        for case in getattr(stmt, "cases", ()):
            _block(case.body, env, dead)


def _exits(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Return | ast.Raise)


def _mark(stmts: list[ast.stmt], dead: list[tuple[int, int, int, int]]) -> None:
    dead.extend((s.lineno, s.col_offset, s.end_lineno or s.lineno, s.end_col_offset or 0) for s in stmts)


def _truth(test: ast.expr, env: Mapping[str, object]) -> bool | None:
    """The test's truth under `env`, or None when it depends on something else."""
    if isinstance(test, ast.Name | ast.Attribute | ast.Call):  # also a bound field: if fb.use_graph:, and what a
        v = env.get(bound_key(test) or "", _UNKNOWN)  # member's method gives: if fb.forward_mode.is_decode():
        return None if v is _UNKNOWN or isinstance(v, Member) else bool(v)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        t = _truth(test.operand, env)
        return None if t is None else not t
    if isinstance(test, ast.BoolOp):
        parts = [_truth(v, env) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # an Or with a true part is true, an And with a false part false
        if decisive in parts:
            return decisive
        return None if None in parts else not decisive
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name | ast.Attribute):
        v = env.get(bound_key(test.left) or "", _UNKNOWN)
        right = test.comparators[0]
        if v is _UNKNOWN:
            return None
        op = test.ops[0]
        if isinstance(v, Member):  # fb.forward_mode == ForwardMode.DECODE, ... in (ForwardMode.EXTEND, ...)
            return _member_test(v, op, right)
        if isinstance(right, ast.Constant):
            c = right.value
            if isinstance(op, ast.Is | ast.IsNot) and not (c is None or isinstance(c, bool)):
                return None  # `is` with a string or a number: interning, not equality, decides
            if isinstance(op, ast.Eq | ast.Is):
                return bool(v == c) if isinstance(op, ast.Eq) else v is c
            if isinstance(op, ast.NotEq | ast.IsNot):
                return bool(v != c) if isinstance(op, ast.NotEq) else v is not c
            numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (v, c))
            if numbers and isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):  # meta.num_prefills > 0
                assert isinstance(v, int | float) and isinstance(c, int | float)
                return _ORDER[type(op)](v, c)
        literal = isinstance(right, ast.Tuple | ast.List | ast.Set) and all(
            isinstance(e, ast.Constant) for e in right.elts
        )
        if isinstance(op, ast.In | ast.NotIn) and literal:
            assert isinstance(right, ast.Tuple | ast.List | ast.Set)
            found = any(v == e.value for e in right.elts if isinstance(e, ast.Constant))
            return found if isinstance(op, ast.In) else not found
    return None


def _member_test(v: Member, op: ast.cmpop, right: ast.expr) -> bool | None:
    """A comparison of a bound member with a member (``==``, ``!=``, ``is``, ``is not``) or a literal tuple of members
    (``in``, ``not in``); None for anything else."""
    if isinstance(op, ast.Eq | ast.Is | ast.NotEq | ast.IsNot) and (m := member(right)) is not None:
        return None if m.enum != v.enum else (v == m) == isinstance(op, ast.Eq | ast.Is)
    if isinstance(op, ast.In | ast.NotIn) and isinstance(right, ast.Tuple | ast.List | ast.Set):
        members = [member(e) for e in right.elts]
        if any(m is None or m.enum != v.enum for m in members):
            return None  # another spelling of the class (an import alias) or another class: undecided
        return (v in members) == isinstance(op, ast.In)
    return None


def member_methods(cls: ClassInfo, value: Member) -> list[tuple[str, object]]:
    """What each method of an enum class that only tests ``self`` (``def is_decode(self): return self ==
    ForwardMode.DECODE``) gives for `value`, keyed ``is_decode()``."""
    out: list[tuple[str, object]] = []
    for name, m in cls.methods.items():
        body = [s for s in m.node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if list(m.params) != ["self"] or len(body) != 1 or not isinstance(body[0], ast.Return) or not body[0].value:
            continue
        got = _truth(body[0].value, {"self": value})
        if got is not None:
            out.append((f"{name}()", got))
    return out


_ENUMS = frozenset({"Enum", "IntEnum", "StrEnum", "IntFlag", "Flag"})
_ORDER: dict[type[ast.cmpop], Callable[[float, float], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def bound_key(expr: ast.expr) -> str | None:
    """The key a binding gives `expr`: a parameter's name, ``fb.use_graph`` for a field of one, and
    ``fb.forward_mode.is_decode()`` for a method of an enum member bound there."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return f"{expr.value.id}.{expr.attr}"
    if isinstance(expr, ast.Call) and not expr.args and not expr.keywords and isinstance(expr.func, ast.Attribute):
        inner = bound_key(expr.func.value)
        return f"{inner}.{expr.func.attr}()" if inner is not None else None
    return None


def bound_value(expr: ast.expr, env: Mapping[str, object]) -> object:
    """The constant `expr` holds under `env` (a literal, a bound parameter or field), else `UNKNOWN`."""
    if isinstance(expr, ast.Constant):
        return expr.value
    key = bound_key(expr)
    return env.get(key, UNKNOWN) if key is not None else UNKNOWN
