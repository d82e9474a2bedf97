"""The rewrites made right after parsing (`flashcheck.verifier.operator_idioms`): what they turn into plain attribute
reads, what they leave alone, and that messages still quote the code as written."""

from __future__ import annotations

import ast

import pytest

from flashcheck.verifier.operator_idioms import as_written, desugar_namespace_items, desugar_operator_idioms


def _namespace(src: str) -> ast.Module:
    tree = ast.parse(src)
    desugar_namespace_items(tree, src)
    return tree


@pytest.mark.parametrize(
    ("src", "expected"),
    [
        ('vars(bufs)["kv_indptr"][n:].fill_(1)', "bufs.kv_indptr[n:].fill_(1)"),
        ('x = self.bufs.__dict__["kv_indptr"]', "x = self.bufs.kv_indptr"),
        ('vars(o)["y"] = t', "o.y = t"),
        ('v = vars(vars(a)["b"])["c"]', "v = a.b.c"),
        ("def f(o):\n    return vars(o)['k']", "def f(o):\n    return o.k"),
        ('self.vars = {}\nx = vars(self.get_w())["_plan_info"]', "self.vars = {}\nx = self.get_w()._plan_info"),
    ],
)
def test_a_namespace_read_as_a_dict_is_the_attribute(src: str, expected: str) -> None:
    assert ast.unparse(_namespace(src)) == expected


@pytest.mark.parametrize(
    "src",
    [
        "v = vars(o)[key]",  # a key that is not a constant
        'v = vars(o)["not an identifier"]',
        'v = vars()["x"]',  # the caller's locals
    ],
)
def test_other_subscripts_stay_as_they_are(src: str) -> None:
    assert ast.unparse(_namespace(src)) == ast.unparse(ast.parse(src))


def test_a_rewritten_node_is_quoted_as_written() -> None:
    src = 'vars(bufs)["kv_last_page_len"][n:bs].fill_(1)\nv = vars(vars(a)["b"])["c"]'
    tree = _namespace(src)
    call = tree.body[0]
    assert isinstance(call, ast.Expr)
    assert ast.unparse(call.value) == "bufs.kv_last_page_len[n:bs].fill_(1)"
    assert as_written(call.value) == "vars(bufs)['kv_last_page_len'][n:bs].fill_(1)"
    assert ast.unparse(call.value) == "bufs.kv_last_page_len[n:bs].fill_(1)"  # quoting leaves the tree as it was
    nested = tree.body[1]
    assert isinstance(nested, ast.Assign)
    assert as_written(nested.value) == "vars(vars(a)['b'])['c']"


def test_an_applied_getter_is_quoted_as_written() -> None:
    src = "import operator\nn = int(operator.attrgetter('seq_lens')(batch).max())"
    tree = ast.parse(src)
    desugar_operator_idioms(tree, src)
    assign = tree.body[1]
    assert isinstance(assign, ast.Assign)
    assert ast.unparse(assign.value) == "int(batch.seq_lens.max())"
    assert as_written(assign.value) == "int(operator.attrgetter('seq_lens')(batch).max())"
