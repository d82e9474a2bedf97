"""Which classes the static verifier takes for ``typing.Protocol`` interfaces: by the module's imports, not by name."""

from __future__ import annotations

import ast

import pytest

from flashcheck.verifier.astutil import is_protocol


def _cls(src: str) -> ast.ClassDef:
    node = ast.parse(src).body[-1]
    assert isinstance(node, ast.ClassDef)
    return node


@pytest.mark.parametrize(
    ("src", "imports"),
    [
        ("class P(Protocol): ...", {"Protocol": "typing.Protocol"}),
        ("class P(t.Protocol): ...", {"t": "typing"}),
        ("class P(Protocol[T]): ...", {"Protocol": "typing_extensions.Protocol"}),
        ("class P(Protocol): ...", {"Protocol": "eng._typing.Protocol"}),  # re-exported by a typing module
        ("class P(Protocol): ...", {"*typing": "typing"}),  # from typing import *
    ],
)
def test_typing_protocols_are_protocols(src: str, imports: dict[str, str]) -> None:
    assert is_protocol(_cls(src), imports)


@pytest.mark.parametrize(
    ("src", "imports"),
    [
        ("class P(asyncio.Protocol): ...", {"asyncio": "asyncio"}),
        ("class P(Protocol): ...", {"Protocol": "asyncio.Protocol"}),
        ("class P(KVTransferProtocol): ...", {}),  # a project class named like one
        ("class P(Protocol): ...", {"Protocol": "eng.wire.Protocol"}),  # the engine's own RPC base
        ("class P(Protocol): ...", {"*eng.constants": "eng.constants"}),  # a star import that is not typing
    ],
)
def test_other_classes_named_protocol_are_not(src: str, imports: dict[str, str]) -> None:
    assert not is_protocol(_cls(src), imports)
