"""FC109 assert-validates-input: ``assert`` used to validate a public function's arguments in library code."""

from __future__ import annotations

import ast

from flashcheck.findings import Confidence, Severity
from flashcheck.verifier.astutil import terminal_name
from flashcheck.verifier.engine import Context, Rule, rule
from flashcheck.verifier.index import POST_INITS, with_bases
from flashcheck.verifier.members import generates_init
from flashcheck.verifier.project import FunctionInfo
from flashcheck.verifier.provenance.flow import arg_for_param
from flashcheck.verifier.rules.fc101_host_sync import snippet


@rule("FC109", "assert-validates-input", severity=Severity.WARNING, confidence=Confidence.MEDIUM)
class AssertValidatesInput(Rule):
    """``assert`` validates the arguments of a public function in library code.

    What it checks
        ``assert`` statements outside test files whose condition reads what a public function (a name not starting with
        ``_``; dunders such as ``__init__`` count as public) received: one of its parameters (other than
        ``self``/``cls``), a local derived from one (``n = len(seq_lens)``, also unpacked: ``mod, _, name =
        spec.partition(":")``), or a ``self.x`` set from one in the same function (in a dataclass's
        ``__post_init__``, the fields its generated constructor received); and asserts in private helpers on
        parameters that a public caller fills from its own arguments. Asserts on the object's own state, on private
        helpers' internal values and in tests are internal invariants and are not reported, nor are asserts in a
        function whose body a compiler translates (``@triton.jit``, ``@numba.njit``, ``@torch.jit.script``): those are
        the compiler's checks, not Python's.

    Why it breaks serving
        ``python -O`` strips asserts, and engines are run that way in production images: the check that stopped a
        bad ``kv_indptr`` or a too-large batch in CI is gone where it matters, and the kernel reads out of bounds
        instead. When not stripped, an ``AssertionError`` carries no numbers, and FlashInfer-facing code cannot tell
        a rejected input from a bug.

    Example
        ::

            def init_forward_metadata(self, batch_size, kv_indptr):
                assert batch_size <= self.max_bs                  # FC109

    Use instead
        ``if batch_size > self.max_bs: raise ValueError(f"batch_size={batch_size} > max_bs={self.max_bs}; ...")``:
        an exception that survives ``-O`` and says what happened and what to do.

    Known false positives
        Asserts used only to narrow a type for the type checker (``assert x is not None`` on an argument) are
        reported; narrow with ``if x is None: raise ...`` or ``typing.cast``.

    What it cannot see
        Validation more than one private call away from the public function, and inputs that arrive through other
        objects' attributes rather than parameters.
    """

    def check(self, ctx: Context) -> None:
        names = _Names()
        for fn in ctx.project.functions:
            if not fn.asserts or fn.source.is_tooling or _compiled(fn):
                continue
            if _is_public(fn):
                inputs = set(fn.params) - {"self", "cls"}
                how = "argument(s)"
            else:  # a private helper validates what a public caller received
                inputs = _fed_by_public_callers(ctx, fn, names)
                how = "argument(s) (passed on by a public caller)"
            if not inputs and fn.name not in POST_INITS:
                continue
            tainted, attrs = _derived(fn, inputs, names)
            fields: dict[str, int] = {}  # a dataclass's fields are its constructor's arguments, until rebound
            if fn.name in POST_INITS and fn.cls is not None:
                fields = {
                    f"self.{f}": _rebound_at(fn, f) for c in with_bases(fn.cls) if generates_init(c) for f in c.fields
                }
                how = "constructor argument(s)"
            for a in fn.asserts:
                if isinstance(a.test, ast.Constant):
                    continue  # assert False, "unreachable"
                used = sorted(names.of(a.test) & tainted)
                if attrs or fields:
                    used += sorted(
                        text
                        for n in ast.walk(a.test)
                        if isinstance(n, ast.Attribute)
                        and ((text := ast.unparse(n)) in attrs or fields.get(text, 0) > a.lineno)
                    )
                if used:
                    ctx.report(
                        self,
                        fn,
                        a,
                        f"`{snippet(a, 60)}` validates {how} {', '.join(used)} of {fn.short} with assert, "
                        "which python -O removes",
                        hint="raise ValueError/TypeError with the offending values and the accepted range instead",
                        evidence={"parameters": used},
                    )


# Decorators that compile the function's body (``@triton.jit``, ``@numba.njit``, ``@torch.jit.script``): its asserts
# become the compiler's checks, which ``python -O`` does not strip.
_COMPILERS = frozenset({"jit", "njit", "script"})


def _rebound_at(fn: FunctionInfo, field: str) -> int:
    """The first line where `fn` binds ``self.<field>`` again (past the end when it never does)."""
    lines = [
        a.lineno
        for a in fn.assigns
        if isinstance(a, ast.Assign | ast.AnnAssign | ast.AugAssign)
        for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
        if isinstance(t, ast.Attribute) and t.attr == field and isinstance(t.value, ast.Name) and t.value.id == "self"
    ]
    return min(lines, default=1 << 30)


def _compiled(fn: FunctionInfo) -> bool:
    return any(terminal_name(d) in _COMPILERS for d in fn.decorators)


def _is_public(fn: FunctionInfo) -> bool:
    return not fn.name.startswith("_") or (fn.name.startswith("__") and fn.name.endswith("__"))


class _Names:
    """The names (``ast.Name`` ids) an expression reads, walked once per expression."""

    def __init__(self) -> None:
        self._seen: dict[ast.expr, frozenset[str]] = {}

    def of(self, expr: ast.expr) -> frozenset[str]:
        found = self._seen.get(expr)
        if found is None:
            found = self._seen[expr] = frozenset(n.id for n in ast.walk(expr) if isinstance(n, ast.Name))
        return found

    def mention(self, expr: ast.expr, names: set[str]) -> bool:
        return not self.of(expr).isdisjoint(names)


def _derived(fn: FunctionInfo, inputs: set[str], names: _Names) -> tuple[set[str], set[str]]:
    """Names derived from `inputs` (``n = len(seq_lens)``, also unpacked: ``head, _, tail = spec.partition(":")``)
    and ``self.x`` attributes set from them in `fn`."""
    tainted = set(inputs)
    unpacked: list[tuple[ast.expr, list[str]]] = []  # module_name, _, class_name = spec.partition(":")
    for a in fn.assigns:
        if not isinstance(a, ast.Assign):
            continue
        value = a.value
        for t in a.targets:
            if not isinstance(t, ast.Tuple | ast.List):
                continue
            elts = value.elts if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(t.elts) else None
            for i, e in enumerate(t.elts):  # a, b = x, self.y: each name from its own element
                if isinstance(e, ast.Name):
                    unpacked.append((elts[i] if elts is not None else value, [e.id]))
    for _ in range(4):
        grown = {name for name, values in fn.local_assigns.items() if any(names.mention(v, tainted) for v in values)}
        grown.update(n for value, bound in unpacked if names.mention(value, tainted) for n in bound)
        if grown <= tainted:
            break
        tainted |= grown
    attrs: set[str] = set()
    for a in fn.assigns:
        if isinstance(a, ast.Assign) and names.mention(a.value, tainted):
            attrs.update(
                ast.unparse(t)
                for t in a.targets
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
            )
    return tainted, attrs


def _fed_by_public_callers(ctx: Context, fn: FunctionInfo, names: _Names) -> set[str]:
    """Parameters of a private function that a public, non-test caller fills from its own arguments."""
    out: set[str] = set()
    params = [p for p in fn.params if p not in ("self", "cls")]
    for caller, call in ctx.project.callers(fn):
        outer = caller
        while outer.name == "<lambda>" and outer.parent is not None:  # a lambda reads its function's inputs
            outer = outer.parent
        if not _is_public(outer) or caller.source.is_test:
            continue
        caller_inputs, _ = _derived(outer, set(outer.params) - {"self", "cls"}, names)
        for p in params:
            arg = arg_for_param(call, fn, p)
            if arg is not None and names.mention(arg, caller_inputs):
                out.add(p)
    return out
