"""Known upstream behaviours match only findings whose innermost library frame is in the named upstream file (never
flashcheck's own adapter of the same name, never an engine bug under the same plan()), with the named event, in the
named versions and no more events per step than the entry expects."""

from __future__ import annotations

import os

import pytest

import flashcheck
from flashcheck.errors import InvalidDefinition
from flashcheck.findings import Finding, Frame, Location
from flashcheck.known import KNOWN_UPSTREAM, KnownBehaviour, split_known
from flashcheck.runtime.monitor import Event, Monitor

ENTRY = KnownBehaviour("FC201", "prefill-*", "flashinfer/prefill.py", "staging copy inside plan()")

OWN = os.path.dirname(os.path.abspath(flashcheck.__file__)).replace("\\", "/")  # the installed package


def f(file: str, id_: str = "FC201", message: str = "m", stack: tuple[str, ...] = ()) -> Finding:
    frames = tuple(Frame(x, 1, "plan") for x in (*stack, file))
    return Finding(id_, "host-sync-in-replay", "runtime", message, stack=frames, location=Location(file=file, line=1))


def test_a_checkout_in_a_folder_named_flashcheck_still_matches_upstream_frames() -> None:
    # CI clones to .../flashcheck/flashcheck/: FlashInfer installed below it is still FlashInfer
    path = "/home/runner/work/flashcheck/flashcheck/.venv/lib/site-packages/flashinfer/prefill.py"
    unexpected, known = split_known([f(path)], "prefill-fa2", known=[ENTRY])
    assert unexpected == [] and known[0][1] is ENTRY


def test_matches_upstream_file_target_and_check() -> None:
    unexpected, known = split_known([f("/x/site/flashinfer/prefill.py")], "prefill-fa3", known=[ENTRY])
    assert unexpected == [] and known[0][1] is ENTRY


@pytest.mark.parametrize(
    ("finding", "target"),
    [
        (f("/x/engine/backend.py"), "prefill-fa3"),
        (f("/x/site/flashinfer/prefill.py"), "decode-tc"),
        (f("/x/site/flashinfer/prefill.py", "FC202"), "prefill-fa2"),
        (f(f"{OWN}/targets/flashinfer/prefill.py"), "prefill-fa2"),  # our adapter of the same name
    ],
)
def test_does_not_hide_other_findings(finding: Finding, target: str) -> None:
    unexpected, known = split_known([finding], target, known=[ENTRY])
    assert unexpected == [finding] and known == []


def test_an_entry_matches_only_its_versions_and_its_event() -> None:
    entry = KnownBehaviour("FC202", "mla-*", "flashinfer/mla.py", "r", versions="0.7*", message="allocation$")
    hit = Finding("FC202", "n", "runtime", "device memory allocation", location=Location(file="/s/flashinfer/mla.py"))
    other_event = Finding("FC202", "n", "runtime", "pool growth", location=hit.location)
    assert split_known([hit, other_event], "mla-fa2", "0.7.2.post1", known=[entry])[0] == [other_event]
    assert split_known([hit], "mla-fa2", "0.6.13", known=[entry])[0] == [hit]
    assert split_known([hit], "mla-fa2", "", known=[entry])[0] == []  # "" matches every version


def test_split_known_defaults_to_the_imported_flashinfer_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from flashcheck.known import imported_flashinfer_version

    entry = KnownBehaviour("FC202", "*", "flashinfer/mla.py", "r", versions="0.7*")
    hit = Finding("FC202", "n", "runtime", "m", location=Location(file="/s/flashinfer/mla.py"))
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.6.13"))
    assert imported_flashinfer_version() == "0.6.13"
    assert split_known([hit], "mla-fa2", known=[entry])[0] == [hit]
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.7.2.post1"))
    assert split_known([hit], "mla-fa2", known=[entry])[0] == []
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace())  # a stub without a version
    assert imported_flashinfer_version() == ""
    monkeypatch.delitem(sys.modules, "flashinfer")
    assert imported_flashinfer_version() == ""


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


# ---- the real ledger on findings the monitor builds from realistic stacks (outermost first) -------------------------
SITE = "/opt/venv/lib/python3.12/site-packages"
OUR_ADAPTER = Frame(
    os.path.join(os.path.dirname(flashcheck.__file__), "targets", "flashinfer", "prefill.py"), 88, "plan"
)
STDLIB = Frame(os.__file__, 10, "wrapper")  # an internal frame below the library (torch, functools)
ENGINE_STEP = Frame("/srv/engine/model_runner.py", 210, "execute_model")
ENGINE_BUILD = Frame("/srv/engine/attention/flashinfer_backend.py", 402, "build_metadata")
ENGINE_COPY = Frame("/srv/engine/attention/flashinfer_backend.py", 409, "build_metadata")
FI_PLAN = Frame(f"{SITE}/flashinfer/prefill.py", 1680, "plan")
FI_KV_LENS = Frame(f"{SITE}/flashinfer/prefill.py", 1790, "plan")  # the kv_lens staging copy (K1)
FI_QO_TO_HOST = Frame(f"{SITE}/flashinfer/prefill.py", 1702, "plan")  # .to("cpu") of a device qo_indptr
MLA = f"{SITE}/flashinfer/mla/_batch_mla"
MLA_PLAN = (
    ENGINE_STEP,
    Frame(f"{MLA}/_wrapper.py", 696, "plan"),
    Frame(f"{MLA}/_planning.py", 834, "audited_plan_from_wrapper"),
)
MLA_932 = (*MLA_PLAN, Frame(f"{MLA}/_backends/_fa_common.py", 932, "plan_from_wrapper"), STDLIB)
MLA_549 = (
    *MLA_PLAN,
    Frame(f"{MLA}/_backends/_fa_common.py", 620, "_plan_generated_fa"),
    Frame(f"{MLA}/_backends/_fa_common.py", 549, "_stage_metadata"),
    STDLIB,
)


def prefill_plan(*events: Event) -> list[Finding]:
    m = Monitor()
    rec = m.enter("plan", step=3)
    for ev in events:
        m.observe(ev)
    m.exit(rec)
    return m.drain()


K1_COPY = Event(
    "h2d_copy", "dispatch", (ENGINE_STEP, OUR_ADAPTER, FI_PLAN, FI_KV_LENS, STDLIB), "aten.copy_", memory="pageable"
)


def test_an_engine_fc201_under_a_prefill_plan_is_reported_while_flashinfers_own_copy_stays_known() -> None:
    engine_device_qo = Event("d2h_copy", "dispatch", (ENGINE_STEP, OUR_ADAPTER, FI_PLAN, FI_QO_TO_HOST, STDLIB))
    engine_tolist = Event("d2h_copy", "dispatch", (ENGINE_STEP, ENGINE_BUILD, STDLIB), "aten._local_scalar_dense")
    engine_pageable = Event("h2d_copy", "dispatch", (ENGINE_STEP, ENGINE_COPY, STDLIB), memory="pageable")
    adapter_copy = Event("h2d_copy", "dispatch", (ENGINE_STEP, OUR_ADAPTER, STDLIB), memory="pageable")
    found = prefill_plan(K1_COPY, engine_device_qo, engine_tolist, engine_pageable, adapter_copy)
    assert [(f.id, f.location.file, f.location.line) for f in found] == [
        ("FC201", FI_KV_LENS.file, FI_KV_LENS.line),
        ("FC201", FI_QO_TO_HOST.file, FI_QO_TO_HOST.line),
        ("FC201", ENGINE_BUILD.file, ENGINE_BUILD.line),
        ("FC201", ENGINE_COPY.file, ENGINE_COPY.line),
        ("FC201", ENGINE_STEP.file, ENGINE_STEP.line),  # our adapter's frame is never the location
    ]
    unexpected, known = split_known(found, "prefill-fa2", "0.6.13")
    assert [(f, k.key) for f, k in known] == [(found[0], "K1")]
    assert unexpected == found[1:]


def test_a_second_pageable_copy_merged_into_flashinfers_finding_is_reported() -> None:
    """A copy only CUPTI sees (no stack) merges into the plan's finding: one more than K1's one copy per plan."""
    (alone,) = prefill_plan(K1_COPY)
    cupti = Event("h2d_copy", "cupti", detail="Memcpy HtoD (Pageable -> Device)", memory="pageable")
    (merged,) = prefill_plan(K1_COPY, cupti, cupti)
    assert alone.evidence["count"] == 1 and merged.evidence["count"] == 2
    assert split_known([alone], "prefill-fa2", "0.6.13")[0] == []
    assert split_known([merged], "prefill-fa2", "0.6.13")[0] == [merged]


def mla_prepare_replay(extra: tuple[Event, ...] = (), total: int = 9) -> list[Finding]:
    """One replay preparation of the 0.7.2 MLA wrapper as the monitor saw it on the H100: gpu_trace allocations
    at _fa_common.py:932 and :549, and the allocator statistics' stackless count for the whole region."""
    m = Monitor()
    rec = m.enter("prepare_replay", step=6)
    for stack, n in ((MLA_932, 5), (MLA_549, 4)):
        for _ in range(n):
            m.observe(Event("alloc", "gpu_trace", stack, "caching-allocator allocation"))
    for ev in extra:
        m.observe(ev)
    m.observe(Event("alloc", "alloc_stats", detail=f"{total} allocation(s)", count=total))
    m.exit(rec)
    return m.drain()


def test_k2_knows_the_mla_allocations_per_replay_preparation_and_no_more() -> None:
    at_932, at_549 = mla_prepare_replay()
    assert (at_932.location.line, at_932.evidence["count"]) == (932, 9)
    assert (at_549.location.line, at_549.evidence["count"]) == (549, 4)
    unexpected, known = split_known([at_932, at_549], "mla-fa2", "0.7.2.post1")
    assert unexpected == [] and {k.key for _, k in known} == {"K2"}
    assert split_known([at_932, at_549], "mla-fa2", "0.6.13")[0] == [at_932, at_549]  # 0.7 only
    assert split_known([at_932, at_549], "prefill-fa2", "0.7.2.post1")[0] == [at_932, at_549]  # MLA only
    # the engine allocates once more under the same plan(): its own line is reported, and so is the
    # FlashInfer finding the allocator's count of 10 merged into
    engine = Event("alloc", "gpu_trace", (ENGINE_STEP, ENGINE_BUILD, STDLIB), "caching-allocator allocation")
    at_932, at_549, mine = mla_prepare_replay((engine,), total=10)
    assert at_932.evidence["count"] == 10 and mine.location.file == ENGINE_BUILD.file
    unexpected, known = split_known([at_932, at_549, mine], "mla-fa3", "0.7.2.post1")
    assert unexpected == [at_932, mine] and [f for f, _ in known] == [at_549]


@pytest.mark.parametrize(("count", "known"), [(None, True), (1, True), (2, False)])
def test_an_entry_matches_only_up_to_its_count_per_step(count: int | None, known: bool) -> None:
    entry = KnownBehaviour("FC201", "*", "flashinfer/prefill.py", "one copy per plan", per_step=1)
    evidence = {} if count is None else {"count": count}  # a finding without a count stands for one event
    finding = Finding("FC201", "n", "runtime", "m", location=Location(file=FI_PLAN.file), evidence=evidence)
    assert bool(split_known([finding], "prefill-fa2", "0.6.13", known=[entry])[1]) is known


def test_every_entry_of_the_real_ledger_is_a_precise_fact() -> None:
    for e in KNOWN_UPSTREAM:
        assert e.label and e.where.startswith("flashinfer/") and e.per_step is not None and e.per_step >= 1
        assert f"({e.label})" in e.reason


def test_a_windows_path_and_a_call_without_a_version() -> None:
    entry = KnownBehaviour("FC202", "*", "flashinfer/mla.py", "r", versions="0.7*")
    win = Finding(
        "FC202", "n", "runtime", "m", location=Location(file="C:\\venv\\Lib\\site-packages\\flashinfer\\mla.py")
    )
    assert entry.matches(win, "mla-fa2", "0.7.2.post1")
    assert entry.matches(win, "mla-fa2")  # no version given: every version matches
    assert not entry.matches(win, "mla-fa2", "0.6.13")
