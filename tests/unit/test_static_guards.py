"""What a constant on a path decides in `flashcheck.verifier.guards`: enum members and ordering comparisons."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flashcheck.verifier.guards import Member, dead_nodes, member
from flashcheck.verifier.index import ModuleIndex
from flashcheck.verifier.indexer import index_module
from flashcheck.verifier.source import SourceFile


def _truth_of(test: str, env: dict[str, object]) -> bool | None:
    from flashcheck.verifier.guards import _truth

    return _truth(ast.parse(test, mode="eval").body, env)


DECODE = Member("ForwardMode", "DECODE")


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("fb.mode == ForwardMode.DECODE", True),
        ("fb.mode != ForwardMode.DECODE", False),
        ("fb.mode == ForwardMode.EXTEND", False),
        ("fb.mode in (ForwardMode.EXTEND, ForwardMode.MIXED)", False),
        ("fb.mode not in (ForwardMode.EXTEND, ForwardMode.MIXED)", True),
        ("fb.mode == Mode.EXTEND", None),  # another spelling of the class (an import alias): undecided
        ("fb.mode in (Mode.DECODE, ForwardMode.EXTEND)", None),
        ("fb.mode == 2", None),  # an IntEnum member may equal a number
        ("fb.mode", None),
        ("fb.n > 0", False),
        ("fb.n >= 0", True),
        ("fb.n < 1", True),
        ("fb.flag > 0", None),  # a bool is not ordered here
    ],
)
def test_what_a_bound_member_or_number_decides(test: str, expected: bool | None) -> None:
    env: dict[str, object] = {"fb.mode": DECODE, "fb.n": 0, "fb.flag": True}
    assert _truth_of(test, env) is expected


def test_member_spelling() -> None:
    assert member(ast.parse("ForwardMode.DECODE", mode="eval").body) == DECODE
    assert member(ast.parse("fb_mod.ForwardMode.DECODE", mode="eval").body) == DECODE
    assert member(ast.parse("torch.float16", mode="eval").body) is None
    assert member(ast.parse("CONSTS.DECODE", mode="eval").body) is None  # an all-caps name is no class


def test_a_method_of_the_member_decides_a_branch() -> None:
    from flashcheck.verifier.guards import member_methods

    src = (
        "import enum\n"
        "class ForwardMode(enum.IntEnum):\n"
        "    EXTEND = 1\n"
        "    DECODE = 2\n"
        "    def is_decode(self):\n"
        "        return self == ForwardMode.DECODE\n"
        "    def is_extend(self):\n"
        "        return self in (ForwardMode.EXTEND,)\n"
        "    def is_idle_or(self, other):\n"
        "        return self == other\n"
        "def forward(fb):\n"
        "    if fb.forward_mode.is_decode():\n"
        "        return 1\n"
        "    extend()\n"
    )
    index = index_module(SourceFile(Path("m.py"), "m.py", "m", src, ast.parse(src)))
    assert isinstance(index, ModuleIndex)
    enum_cls = index.classes[0]
    facts = dict(member_methods(enum_cls, DECODE))
    assert facts == {"is_decode()": True, "is_extend()": False}  # a method with another parameter decides nothing
    forward = next(f for f in index.functions if f.name == "forward")
    bound = frozenset({("fb.forward_mode", DECODE), *(("fb.forward_mode." + k, v) for k, v in facts.items())})
    dead = dead_nodes(forward, bound)
    extend_call = next(c for c in forward.calls if isinstance(c.func, ast.Name) and c.func.id == "extend")
    assert extend_call in dead
