"""Whether a project handles a FlashInfer plan callable as a value (`Wrappers.plans_as_values`): only then does
the static verifier follow aliases, items, parameters and returns to find plan calls not written as ``w.plan(...)``,
which is most of FC102's time on a large engine without any. The fixtures check what is found either way."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flashcheck.verifier.frontend import summarise_files
from flashcheck.verifier.project import Project
from flashcheck.verifier.provenance import ValueFlow, Wrappers
from flashcheck.verifier.source import discover

_HEAD = """
import functools
import flashinfer
from flashinfer.decode import fast_decode_plan

class Backend:
    def __init__(self, ws):
        self.w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        self.plan = None  # a scheduling plan: a name, not the wrapper's method

    def step(self, indptr, plan):
        self.w.plan(indptr)
        fast_decode_plan(self.w, indptr)
        self.plan = plan
        return plan
"""


def _wrappers(tmp_path: Path, extra: str) -> Wrappers:
    (tmp_path / "eng.py").write_text(textwrap.dedent(_HEAD) + textwrap.indent(textwrap.dedent(extra), "        "))
    summaries = summarise_files(discover([str(tmp_path)], (), tmp_path), tmp_path).summaries
    project = Project([sf for sf, _ in summaries], [mi for _, mi in summaries])
    return Wrappers(ValueFlow(project))


def test_plan_calls_as_written_are_not_plan_values(tmp_path: Path) -> None:
    assert not _wrappers(tmp_path, "").plans_as_values()


@pytest.mark.parametrize(
    "extra",
    [
        "self.run_plan = self.w.plan",  # a bound method kept
        "return functools.partial(self.w.plan, indptr)",  # a partial of it
        "self.shim = fast_decode_plan",  # FlashInfer's plan function kept
        'return getattr(self.w, "plan")',  # looked up by name
        "self.hooks = {'begin': self.w.begin_forward}",  # the older name, in a literal
        "def run(p=fast_decode_plan): return p",  # a parameter's default
        "if (p := fast_decode_plan) is not None: self.p = p",  # a walrus
        "for f in (fast_decode_plan,): self.p = f",  # a loop's iterable
        "self.plans = {b: fast_decode_plan for b in range(8)}",  # a comprehension
        "self.p = (fast_decode_plan, None)[0]",  # an item of a literal
    ],
)
def test_each_way_to_hold_a_plan_is_a_plan_value(tmp_path: Path, extra: str) -> None:
    assert _wrappers(tmp_path, extra).plans_as_values()


def test_a_plan_function_imported_under_another_name_is_a_plan_value(tmp_path: Path) -> None:
    (tmp_path / "shim.py").write_text("from flashinfer.decode import fast_decode_plan as fdp\n\nPLAN = fdp\n")
    assert _wrappers(tmp_path, "").plans_as_values()
