"""Which code of a function may run before or after a given line on the same path, by its structured control flow:
blocks, the branches of ``if``/``match``, loops, ``try`` (handlers, ``else``, ``finally``), ``return`` and
``raise``. FC104 orders a write to a graph-bound buffer against the plans around it with this."""

from __future__ import annotations

import ast
from collections.abc import Callable

__all__ = ["runs_after", "runs_before"]

_Spans = list[tuple[int, int]]
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def runs_after(body: list[ast.stmt], line: int) -> Callable[[int], bool]:
    """Whether code on a given line may run after the statement on `line` of a function `body`: the statements after it
    in its block and in the blocks around it, up to a ``return``, ``raise`` or ``yield`` that ends its path (a ``raise``
    caught by a ``try`` around it goes on in the handlers), a ``try``'s handlers, ``else`` and ``finally`` after its
    body (only ``finally`` after a handler or the ``else``), and the whole of any loop around it (after a ``break``,
    only what follows the loop); not the other branches of an ``if`` it sits in. Any line, when `line` is in no
    statement of `body` or its path raises out of the function (nothing is replayed then)."""
    found = _after(body, line)
    if found is None or found[1] == "raise":
        return lambda _: True
    spans = found[0]
    return lambda other: any(start <= other <= end for start, end in spans)


def runs_before(body: list[ast.stmt], line: int) -> Callable[[int], bool]:
    """Whether code on a given line may have run before the statement on `line` of a function `body` on its path:
    earlier statements of its block and of the blocks around it (the tests of an ``if`` or loop, a ``with``'s
    context managers), but not the blocks of an earlier statement that end in ``return``/``raise``, nor the other
    branches of an ``if``; the body of a ``try`` before its handlers and ``else``; the whole of any loop around it.
    A generator's ``yield`` statement (also at the end of a ``with`` block) starts the path again: its consumer runs,
    and may replay, before the code after it, so what ran before it (and an earlier iteration of a loop whose body
    yields) is not on the path.
    Any line, when `line` is in no statement of `body`."""
    spans = _before(body, line)
    if spans is None:
        return lambda _: True
    return lambda other: any(start <= other <= end for start, end in spans)


def _span(block: list[ast.stmt]) -> tuple[int, int]:
    return block[0].lineno, block[-1].end_lineno or block[-1].lineno


def _holds(stmt: ast.stmt, line: int) -> bool:
    return stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno)


def _in_block(block: list[ast.stmt], line: int) -> bool:
    return bool(block) and any(_holds(s, line) for s in block)


def _blocks(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement other than a ``try``: its body, ``match`` cases, ``else``."""
    body = getattr(stmt, "body", None)
    blocks: list[list[ast.stmt]] = [body] if isinstance(body, list) else []
    blocks.extend(c.body for c in getattr(stmt, "cases", []))
    orelse = getattr(stmt, "orelse", None)
    return blocks + ([orelse] if isinstance(orelse, list) and orelse else [])


def _header(stmt: ast.stmt) -> _Spans:
    """The lines of `stmt` that run before its blocks: an ``if``'s or ``while``'s test, a ``for``'s iterable, a
    ``with``'s context managers, a ``match``'s subject."""
    if isinstance(stmt, ast.If | ast.While):
        return [(stmt.test.lineno, stmt.test.end_lineno or stmt.test.lineno)]
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [(stmt.iter.lineno, stmt.iter.end_lineno or stmt.iter.lineno)]
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [(stmt.lineno, stmt.body[0].lineno - 1)]
    if isinstance(stmt, ast.Match):
        return [(stmt.subject.lineno, stmt.subject.end_lineno or stmt.subject.lineno)]
    return []


_ENDINGS = {ast.Return: "return", ast.Raise: "raise", ast.Break: "break", ast.Continue: "continue"}


def _ends(block: list[ast.stmt], *, yields: bool = False) -> str:
    """How a block's last statement ends its path: "return", "raise", "break", "continue", or ""; with `yields`, a
    ``yield`` as a statement counts as a return (the generator's consumer runs then, and may replay, before the rest
    runs after the generator resumes); a ``with`` block ends as its body does."""
    if not block:
        return ""
    last = block[-1]
    if isinstance(last, ast.With | ast.AsyncWith):  # with stream(s): ...; return/raise/yield at the block's end
        return _ends(last.body, yields=yields)
    value = last.value if isinstance(last, ast.Expr | ast.Assign | ast.AnnAssign) else None
    if yields and isinstance(value, ast.Yield | ast.YieldFrom):
        return "return"
    return _ENDINGS.get(type(last), "")


def _after(body: list[ast.stmt], line: int) -> tuple[_Spans, str] | None:
    """(line spans that may run after `line`, how its path ends: "" when it goes on after `body`, "return",
    "raise", or "break"/"continue" out of the loop around `body`) or None when `body` does not hold `line`."""
    for i, stmt in enumerate(body):
        if not _holds(stmt, line):
            continue
        spans: _Spans = []
        ended = ""
        if isinstance(stmt, ast.Try | getattr(ast, "TryStar", ast.Try)):
            spans, ended = _after_in_try(stmt, line)
        elif not isinstance(stmt, _DEFS):
            for block in _blocks(stmt):
                inner = _after(block, line)
                if inner is not None:
                    spans, ended = inner
                    break
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While) and ended in ("", "break", "continue"):
            if ended != "break":  # the next iteration (and the loop's else); a break leaves both out
                spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
            ended = ""  # then what follows the loop
        if ended:
            return spans, ended
        for later in body[i + 1 :]:
            spans.append((later.lineno, later.end_lineno or later.lineno))
            if _ends([later], yields=True):
                return spans, _ends([later], yields=True)
        return spans, ""
    return None


def _after_in_try(stmt: ast.Try, line: int) -> tuple[_Spans, str]:
    handlers = [h.body for h in stmt.handlers]
    final = [_span(stmt.finalbody)] if stmt.finalbody else []
    inner = _after(stmt.body, line)
    if inner is not None:
        spans, ended = inner
        if ended == "raise" and handlers:  # caught here: a handler runs, then what follows the try
            return spans + [_span(h) for h in handlers if h] + final, ""
        if ended:
            return spans + final, ended
        return spans + [_span(h) for h in handlers if h] + ([_span(stmt.orelse)] if stmt.orelse else []) + final, ""
    for block in [*handlers, stmt.orelse]:
        inner = _after(block, line) if block else None
        if inner is not None:
            return inner[0] + final, inner[1]
    inner = _after(stmt.finalbody, line)
    return inner if inner is not None else ([], "")


def _before(body: list[ast.stmt], line: int) -> _Spans | None:
    for i, stmt in enumerate(body):
        if not _holds(stmt, line):
            continue
        # a generator's `yield` hands over to its consumer (which may replay): what ran before it is not this path's
        cut = max((j + 1 for j, earlier in enumerate(body[:i]) if _ends([earlier], yields=True)), default=0)
        spans: _Spans = [s for earlier in body[cut:i] for s in _falls_through(earlier)]
        spans += _header(stmt)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While) and not any(_ends([b], yields=True) for b in stmt.body):
            spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno))  # an earlier iteration
        if isinstance(stmt, ast.Try | getattr(ast, "TryStar", ast.Try)):
            spans += _before_in_try(stmt, line)
        elif not isinstance(stmt, _DEFS):
            for block in _blocks(stmt):
                inner = _before(block, line)
                if inner is not None:
                    spans += inner
                    break
        return spans
    return None


def _before_in_try(stmt: ast.Try, line: int) -> _Spans:
    handlers = [h.body for h in stmt.handlers]
    body = [_span(stmt.body)] if stmt.body else []
    for block, earlier in [(stmt.body, []), *[(h, body) for h in handlers], (stmt.orelse, body)]:
        if _in_block(block, line):
            return earlier + (_before(block, line) or [])
    ran = body + [_span(h) for h in handlers if h and not _ends(h)] + ([_span(stmt.orelse)] if stmt.orelse else [])
    return ran + (_before(stmt.finalbody, line) or [])


def _falls_through(stmt: ast.stmt) -> _Spans:
    """Line spans of `stmt` that may run before the code after it: all of a simple statement; of a compound one its
    test or header and each block that does not end in ``return``/``raise`` (``if prefill: plan(); return``)."""
    if isinstance(stmt, _DEFS) or not hasattr(stmt, "body"):
        return [(stmt.lineno, stmt.end_lineno or stmt.lineno)]
    blocks = _blocks(stmt) + [h.body for h in getattr(stmt, "handlers", [])]
    final = getattr(stmt, "finalbody", None)
    blocks += [final] if isinstance(final, list) else []
    loop = isinstance(stmt, ast.For | ast.AsyncFor | ast.While)  # a loop's break or continue still reaches past it
    stops = ("return", "raise") if loop else ("return", "raise", "break", "continue")
    if not any(b and _ends(b) in stops for b in blocks):
        return [(stmt.lineno, stmt.end_lineno or stmt.lineno)]
    return _header(stmt) + [_span(b) for b in blocks if b and _ends(b) not in stops]
