"""Known upstream behaviours match only findings whose innermost library frame is in the named upstream file (never
flashcheck's own adapter of the same name, never an engine bug under the same plan()), with the named event."""

from __future__ import annotations

import pytest

from flashcheck.errors import InvalidDefinition
from flashcheck.findings import Finding, Frame, Location
from flashcheck.known import KNOWN_UPSTREAM, KnownBehaviour, split_known

ENTRY = KnownBehaviour("FC201", "prefill-*", "flashinfer/prefill.py", "staging copy inside plan()")


def f(file: str, id_: str = "FC201", message: str = "m", stack: tuple[str, ...] = ()) -> Finding:
    frames = tuple(Frame(x, 1, "plan") for x in (*stack, file))
    return Finding(id_, "host-sync-in-replay", "runtime", message, stack=frames, location=Location(file=file, line=1))


ENGINE = "/srv/engine/attn/flashinfer_backend.py"
ADAPTER = "/x/src/flashcheck/targets/flashinfer/prefill.py"
FI_PREFILL = "/x/site/flashinfer/prefill.py"
K1_MESSAGE = "host-to-device copy from pageable memory (a blocking staging copy) inside `plan` at step 3"


def test_the_real_ledger_keeps_flashinfers_own_copy_known_and_reports_the_engines_bug() -> None:
    own = f(FI_PREFILL, message=K1_MESSAGE, stack=(ENGINE, ADAPTER))
    # the engine passes device qo_indptr to plan(): FlashInfer copies it to the host, the same plan() frame
    engine_d2h = f(FI_PREFILL, message="device-to-host copy inside `plan` at step 3", stack=(ENGINE,))
    # an engine's own .tolist() in its metadata builder, under a stack that holds FlashInfer's and our adapter
    engine_tolist = f(ENGINE, message="device-to-host copy inside `plan`", stack=(FI_PREFILL, ADAPTER))
    adapter = f(ADAPTER, message=K1_MESSAGE)
    unexpected, known = split_known([own, engine_d2h, engine_tolist, adapter], "prefill-fa2", known=KNOWN_UPSTREAM)
    assert [k[0] for k in known] == [own]
    assert unexpected == [engine_d2h, engine_tolist, adapter]


def test_matches_upstream_file_target_and_check() -> None:
    unexpected, known = split_known([f("/x/site/flashinfer/prefill.py")], "prefill-fa3", known=[ENTRY])
    assert unexpected == [] and known[0][1] is ENTRY


@pytest.mark.parametrize(
    ("finding", "target"),
    [
        (f("/x/engine/backend.py"), "prefill-fa3"),
        (f("/x/site/flashinfer/prefill.py"), "decode-tc"),
        (f("/x/site/flashinfer/prefill.py", "FC202"), "prefill-fa2"),
    ],
)
def test_does_not_hide_other_findings(finding: Finding, target: str) -> None:
    unexpected, known = split_known([finding], target, known=[ENTRY])
    assert unexpected == [finding] and known == []


def test_entry_needs_reason() -> None:
    with pytest.raises(InvalidDefinition, match="needs a reason"):
        KnownBehaviour("FC201", "*", "x.py", " ")


def test_entries_that_applied_but_matched_nothing_are_reported() -> None:
    from flashcheck.known import KNOWN_UPSTREAM, unmatched_entries

    keys = {e.key for e in KNOWN_UPSTREAM}
    assert {"K1", "K2", "K4", "K5"} <= keys  # every entry has a stable label
    # a decode-tc run on 0.7.2 that saw K4: K1 and K5 apply to every target and matched nothing; K2 is MLA-only
    news = {e.key for e in unmatched_entries({"K4": 64}, ["decode-tc"], "0.7.2.post1")}
    assert news == {"K1", "K5"}
    # on 0.6.13 the MLA entry (0.7 only) does not apply; on 0.7.2 with an MLA target it does
    assert "K2" not in {e.key for e in unmatched_entries({}, ["mla-fa2"], "0.6.13")}
    assert "K2" in {e.key for e in unmatched_entries({}, ["mla-fa2"], "0.7.2.post1")}
    assert unmatched_entries({"K1": 1, "K2": 1, "K4": 1, "K5": 1}, ["mla-fa2"], "0.7.2.post1") == []
    assert unmatched_entries({}, [], "0.7.2.post1") == []  # nothing ran: nothing applies
    assert unmatched_entries({}, ["cpu-reference"], "") == []  # FlashInfer never loaded: no upstream entry applies
