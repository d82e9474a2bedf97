"""The static verifier's memos answer for the node they were asked about, also for nodes built during the analysis
(an item read synthesised for ``map(attrgetter("_x"), ws)``): a memo keyed by ``id()`` handed a freed node's answer
to a later node at the same address, so that what one project found depended on what ran before it."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from flashcheck.verifier.frontend import summarise_files
from flashcheck.verifier.project import Project
from flashcheck.verifier.provenance import ValueFlow, Wrappers
from flashcheck.verifier.source import discover

_ENGINE = """
import flashinfer

class Runner:
    def __init__(self, ws, n):
        self.wrappers = [flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD") for _ in range(n)]
        self.sizes = [1, 2, 4]

    def stats(self):
        return self.wrappers, self.sizes
"""


def test_a_built_node_never_inherits_a_freed_one_s_answer(tmp_path: Path) -> None:
    (tmp_path / "eng.py").write_text(textwrap.dedent(_ENGINE))
    summaries = summarise_files(discover([str(tmp_path)], (), tmp_path), tmp_path).summaries
    project = Project([sf for sf, _ in summaries], [mi for _, mi in summaries])
    wrappers = Wrappers(ValueFlow(project))
    fn = next(f for f in project.functions if f.name == "stats")
    ret = fn.returns[0]
    assert isinstance(ret, ast.Tuple)
    wrapper_list, size_list = ret.elts
    # the item reads FC103 builds: one over the wrappers, then, after it is gone, many over the sizes (CPython
    # hands a freed node's address to the next node of its size)
    first = ast.Subscript(wrapper_list, ast.Constant(...), ast.Load())
    assert wrappers.wrapper_class(first, fn) == "BatchDecodeWithPagedKVCacheWrapper"
    seen = {id(first)}
    del first
    for _ in range(64):
        item = ast.Subscript(size_list, ast.Constant(...), ast.Load())
        seen.add(id(item))
        assert wrappers.wrapper_class(item, fn) is None
    assert len(seen) == 65  # every node asked about is kept by the memo: no address came back
