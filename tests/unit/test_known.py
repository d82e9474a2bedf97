"""Known upstream behaviours match only findings pointing into the named upstream file."""

from __future__ import annotations

import pytest

from flashcheck.errors import InvalidDefinition
from flashcheck.findings import Finding, Frame
from flashcheck.known import KnownBehaviour, split_known

ENTRY = KnownBehaviour("FC201", "prefill-*", "flashinfer/prefill.py", "staging copy inside plan()")


def f(file: str, id_: str = "FC201") -> Finding:
    return Finding(id_, "host-sync-in-replay", "runtime", "m", stack=(Frame(file, 1, "plan"),))


def test_matches_upstream_file_target_and_check() -> None:
    unexpected, known = split_known([f("/x/site/flashinfer/prefill.py")], "prefill-fa3", known=[ENTRY])
    assert unexpected == [] and known[0][1] is ENTRY


@pytest.mark.parametrize(
    ("finding", "target"),
    [(f("/x/engine/backend.py"), "prefill-fa3"), (f("/x/site/flashinfer/prefill.py"), "decode-tc"),
     (f("/x/site/flashinfer/prefill.py", "FC202"), "prefill-fa2")],
)
def test_does_not_hide_other_findings(finding: Finding, target: str) -> None:
    unexpected, known = split_known([finding], target, known=[ENTRY])
    assert unexpected == [finding] and known == []


def test_entry_needs_reason() -> None:
    with pytest.raises(InvalidDefinition, match="needs a reason"):
        KnownBehaviour("FC201", "*", "x.py", " ")
