"""FC204 pinned-staging-reused-in-flight: the pure state machine on synthetic copies and accesses, and the torch
adapter on simulated pinned/device tensors with fake events (CPU torch cannot pin memory)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from flashcheck.catalogue import get_check
from flashcheck.driver import Driver
from flashcheck.findings import Frame
from flashcheck.layout import PagedLayout
from flashcheck.runtime import Checker
from flashcheck.runtime.hooks.staging import StagingHook, tensor_span
from flashcheck.runtime.simdevice import as_device, as_pinned
from flashcheck.runtime.staging import Span, StagingMonitor, Where
from flashcheck.scenario import Step
from flashcheck.targets.protocol import TargetEnv
from flashcheck.targets.reference import ReferenceTarget


def here() -> int:
    return sys._getframe(1).f_lineno


class Flag:
    """A completion predicate the test flips."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self) -> bool:
        return self.done


def frames(line: int) -> tuple[Frame, ...]:
    return (Frame("/engine/runner.py", line, "prepare"),)


# ---- the pure state machine -------------------------------------------------------------------------------------
def test_write_to_a_pending_h2d_source_fires_with_both_stacks() -> None:
    m = StagingMonitor()
    m.copy("h2d", Span(1000, 1064), done=Flag(), stack=frames(10), detail="copy", where=Where("prepare_replay", 3))
    assert m.access("write", Span(1000, 1004), stack=frames(11), detail="aten.fill_", where=Where("prepare_replay", 3))
    (f,) = m.drain()
    assert f.id == "FC204" and f.name == "pinned-staging-reused-in-flight"
    assert (f.location.file, f.location.line, f.location.step, f.location.region) == (
        "/engine/runner.py",
        11,
        3,
        "prepare_replay",
    )
    assert f.evidence["copy_line"] == "/engine/runner.py:10" and f.evidence["copy_stack"][-1].startswith(
        "/engine/runner.py:10"
    )
    assert f.evidence["access"] == "write" and f.evidence["direction"] == "h2d"
    assert "still in flight" in f.message and "written" in f.message
    assert m.drain() == []


def test_write_after_completion_is_quiet_and_forgets_the_copy() -> None:
    m, done = StagingMonitor(), Flag()
    m.copy("h2d", Span(0, 64), done=done, stack=frames(10))
    done.done = True
    assert m.access("write", Span(0, 64), stack=frames(11)) == 0
    assert m.drain() == [] and not m.has_pending


def test_write_to_another_buffer_is_quiet() -> None:
    m = StagingMonitor()
    m.copy("h2d", Span(0, 64), done=Flag(), stack=frames(10))
    assert m.access("write", Span(64, 128), stack=frames(11)) == 0  # adjacent, not overlapping
    assert m.access("write", Span(4096, 4100), stack=frames(12)) == 0
    assert m.drain() == [] and m.has_pending


@pytest.mark.parametrize("span", [Span(60, 70), Span(0, 1), Span(63, 64), Span(-10, 1000)])
def test_overlapping_access_fires(span: Span) -> None:
    m = StagingMonitor()
    m.copy("h2d", Span(0, 64), done=Flag(), stack=frames(10))
    assert m.access("write", span, stack=frames(11)) == 1
    assert [f.id for f in m.drain()] == ["FC204"]


def test_reading_an_h2d_source_is_quiet_reading_a_d2h_destination_fires() -> None:
    m = StagingMonitor()
    m.copy("h2d", Span(0, 64), done=Flag(), stack=frames(10))
    assert m.access("read", Span(0, 64), stack=frames(11)) == 0
    m.copy("d2h", Span(128, 192), done=Flag(), stack=frames(20), where=Where("plan", 1))
    assert m.access("read", Span(128, 132), stack=frames(21), detail="Tensor.tolist", where=Where("plan", 1)) == 1
    (f,) = m.drain()
    assert f.evidence["direction"] == "d2h" and f.evidence["access"] == "read" and "read by the host" in f.message


def test_read_after_the_event_is_quiet() -> None:
    m, done = StagingMonitor(), Flag()
    m.copy("d2h", Span(0, 64), done=done, stack=frames(10))
    done.done = True
    assert m.access("read", Span(0, 64), stack=frames(11)) == 0
    assert m.drain() == []


def test_repeated_races_fold_into_one_finding_per_line_pair_and_step() -> None:
    m = StagingMonitor()
    for _ in range(3):
        m.copy("h2d", Span(0, 64), done=Flag(), stack=frames(10), where=Where("replay", 2))
        m.access("write", Span(0, 64), stack=frames(11), detail="aten.fill_", where=Where("replay", 2))
    m.access("write", Span(0, 64), stack=frames(12), where=Where("replay", 2))
    found = m.drain()
    assert sorted((f.location.line, f.evidence["count"]) for f in found) == [(11, 6), (12, 3)]


def test_synchronized_and_retire_forget_copies_and_the_bound_holds() -> None:
    m = StagingMonitor(max_pending=2)
    done = Flag()
    m.copy("h2d", Span(0, 8), done=done)
    m.copy("h2d", Span(8, 16), done=Flag())
    m.copy("h2d", Span(16, 24), done=Flag())  # over the bound: the completed one goes first
    assert len(m.pending) == 2
    done.done = True
    assert m.retire() == 2
    m.synchronized()
    assert not m.has_pending and m.access("write", Span(0, 24)) == 0


def test_the_page_has_every_section() -> None:
    info = get_check("FC204")
    assert info.kind == "runtime" and info.missing_sections() == []
    assert "numpy" in info.doc and "C++" in info.doc  # it says what is not seen


# ---- the torch adapter ------------------------------------------------------------------------------------------
class FakeOps:
    """Events the test completes by hand; holds and captures recorded."""

    def __init__(self) -> None:
        self.flags: list[Flag] = []
        self.holds: list[float] = []
        self.capture = False

    def capturing(self) -> bool:
        return self.capture

    def mark(self) -> Callable[[], bool]:
        self.flags.append(Flag())
        return self.flags[-1]

    def hold(self, us: float) -> None:
        self.holds.append(us)

    def stream(self) -> int:
        return 0

    def complete(self) -> None:
        for f in self.flags:
            f.done = True


def staged() -> tuple[Checker, StagingHook, FakeOps]:
    ops = FakeOps()
    hook = StagingHook(ops=ops, hold_us=50_000.0)
    return Checker(layers=[hook]), hook, ops


def pinned(n: int = 16) -> torch.Tensor:
    return as_pinned(torch.zeros(n, dtype=torch.int32))


def device(n: int = 16) -> torch.Tensor:
    return as_device(torch.zeros(n, dtype=torch.int32))


WRITES: dict[str, Callable[[torch.Tensor], object]] = {
    "fill_": lambda p: p.fill_(7),
    "zero_": lambda p: p[:4].zero_(),
    "add_": lambda p: p.add_(1),
    "copy_": lambda p: p.copy_(torch.arange(16, dtype=torch.int32)),
    "setitem": lambda p: p.__setitem__(3, 9),
    "setitem_slice": lambda p: p.__setitem__(slice(2, 5), 1),
    "index_put": lambda p: p.index_put_((torch.tensor([1]),), torch.tensor([5], dtype=torch.int32)),
    "view_write": lambda p: p.view(4, 4)[1].fill_(2),
}


@pytest.mark.parametrize("op", sorted(WRITES))
def test_host_write_to_a_pinned_source_in_flight_fires_at_the_write(op: str) -> None:
    chk, hook, ops = staged()
    src, dst = pinned(), device()
    with chk, chk.region("prepare_replay", step=4):
        copy_line = here() + 1
        dst.copy_(src, non_blocking=True)
        WRITES[op](src)
        found = chk.drain_findings()
    assert [f.id for f in found] == ["FC204"], found
    (f,) = found
    assert f.location.file == __file__ and f.location.step == 4 and f.location.region == "prepare_replay"
    assert f.location.line == WRITES[op].__code__.co_firstlineno
    assert f.evidence["copy_line"] == f"{__file__}:{copy_line}"
    assert ops.holds == [50_000.0] and hook.tracked == 1


@pytest.mark.parametrize("op", sorted(WRITES))
def test_the_same_write_after_the_event_completed_is_quiet(op: str) -> None:
    chk, _, ops = staged()
    src, dst = pinned(), device()
    with chk, chk.region("prepare_replay", step=4):
        dst.copy_(src, non_blocking=True)
        ops.complete()
        WRITES[op](src)
        assert chk.drain_findings() == []


def test_writes_to_another_buffer_or_a_disjoint_view_are_quiet() -> None:
    chk, _, _ = staged()
    base, other, dst = pinned(32), pinned(), device()
    with chk, chk.region("prepare_replay", step=0):
        dst.copy_(base[:16], non_blocking=True)
        base[16:].fill_(3)  # same allocation, bytes the copy does not read
        other.fill_(3)
        torch.zeros(16, dtype=torch.int32).fill_(1)
        assert chk.drain_findings() == []


def test_overlapping_view_write_fires() -> None:
    chk, _, _ = staged()
    base, dst = pinned(32), device(8)
    with chk, chk.region("replay", step=1):
        dst.copy_(base[4:12], non_blocking=True)
        base[10:20].fill_(1)
        (f,) = chk.drain_findings()
    assert f.id == "FC204" and f.evidence["access"] == "write"


READS: dict[str, Callable[[torch.Tensor], object]] = {
    "tolist": lambda p: p.tolist(),
    "item": lambda p: p[0].item(),
    "numpy": lambda p: p.numpy(),
    "sum": lambda p: p.sum(),
    "int": lambda p: int(p[1]),
}


@pytest.mark.parametrize("op", sorted(READS))
def test_host_read_of_a_d2h_destination_before_its_event_fires(op: str) -> None:
    chk, _, ops = staged()
    src, dst = device(), pinned()
    with chk, chk.region("plan", step=2):
        dst.copy_(src, non_blocking=True)
        READS[op](dst)
        found = chk.drain_findings()
    assert [f.id for f in found] == ["FC204"], found
    assert found[0].evidence["access"] == "read" and found[0].location.line == READS[op].__code__.co_firstlineno
    with chk, chk.region("plan", step=3):
        dst.copy_(src, non_blocking=True)
        ops.complete()
        READS[op](dst)
        assert chk.drain_findings() == []


def test_reading_an_h2d_source_and_blocking_or_pageable_copies_are_quiet() -> None:
    chk, hook, ops = staged()
    src, dst = pinned(), device()
    with chk, chk.region("prepare_replay", step=0):
        dst.copy_(src, non_blocking=True)
        src.tolist()
        src.sum()
        dst.copy_(src)  # blocking: not tracked
        dst.copy_(torch.zeros(16, dtype=torch.int32), non_blocking=True)  # pageable: staged synchronously
        assert chk.drain_findings() == []
    assert hook.tracked == 1 and ops.holds == [50_000.0]


def test_copies_while_capturing_outside_hot_regions_or_in_checker_reads_are_not_tracked() -> None:
    chk, hook, ops = staged()
    src, dst = pinned(), device()
    with chk:
        dst.copy_(src, non_blocking=True)  # no region
        with chk.region("setup"):
            dst.copy_(src, non_blocking=True)
        with chk.region("replay", step=0), chk.checker_read():
            dst.copy_(src, non_blocking=True)
        ops.capture = True
        with chk.region("replay", step=0):
            dst.copy_(src, non_blocking=True)
            src.fill_(1)
        assert chk.drain_findings() == []
    assert hook.tracked == 0 and ops.holds == []


def test_a_copy_from_one_region_races_with_a_write_in_the_next() -> None:
    chk, _, _ = staged()
    src, dst = pinned(), device()
    with chk:
        with chk.region("prepare_replay", step=0):
            dst.copy_(src, non_blocking=True)
        with chk.region("plan", step=1):
            src.fill_(0)
        (f,) = chk.drain_findings()
    assert f.location.step == 1 and f.evidence["copy_region"] == "prepare_replay"


def test_a_copy_to_meta_is_not_tracked_and_spans_cover_strided_views() -> None:
    chk, hook, _ = staged()
    src = pinned()
    with chk, chk.region("plan", step=0):
        src.to("meta")  # not a device: not tracked
        assert hook.tracked == 0
    assert tensor_span(torch.zeros(0)) is None
    s = tensor_span(torch.zeros(4, 4, dtype=torch.int32)[:, 1])
    assert s is not None and s.end - s.start == (3 * 4 + 1) * 4


def test_off_costs_nothing_and_hooks_are_reversible() -> None:
    before = torch._C._len_torch_dispatch_stack()
    chk, _, _ = staged()
    with chk:
        assert torch._C._len_torch_dispatch_stack() == before  # nothing pushed outside regions
        with chk.region("replay", step=0):
            assert torch._C._len_torch_dispatch_stack() == before + 1
        assert torch._C._len_torch_dispatch_stack() == before
    assert torch._C._len_torch_dispatch_stack() == before


def test_the_layer_is_unavailable_without_cuda_and_says_so() -> None:
    with Checker(layers=["staging"]) as chk:
        if not torch.cuda.is_available():
            assert "CUDA" in chk.skipped_layers["staging"] and "staging" not in chk.active_layers


def test_holds_top_up_the_queue_instead_of_stacking() -> None:
    """Back-to-back copies in one region: the first is held the full time, the next ones by what the queue ahead of
    them no longer covers (credited at half its estimated length, the margin for GPU clocks that vary), so each
    copy stays in flight at least hold_us after it is issued."""
    now = [100.0]
    ops = FakeOps()
    hook = StagingHook(ops=ops, hold_us=1000.0, clock=lambda: now[0])
    chk = Checker(layers=[hook])
    src, dst = pinned(), device()
    with chk, chk.region("prepare_replay", step=0):
        dst.copy_(src, non_blocking=True)
        dst.copy_(src, non_blocking=True)  # same instant: 1000 us queued ahead, credited as 500
        now[0] += 400e-6
        dst.copy_(src, non_blocking=True)  # 400 us later: 600 us ahead, credited as 300: topped up by 700 us
        now[0] += 5e-3
        dst.copy_(src, non_blocking=True)  # the queue drained long ago: the full hold again
    assert hook.tracked == 4
    assert ops.holds == pytest.approx([1000.0, 500.0, 700.0, 1000.0])


# ---- end to end through the driver (CPU: simulated pinned and device tensors, fake events) --------------------
class MirrorRewrittenInFlight(ReferenceTarget):
    """Copies the pinned ``last_page_len`` mirror to the persistent buffer with ``non_blocking=True``, then writes the
    next batch's values into the mirror at once (an overlapped scheduler)."""

    name = "mirror-rewritten-in-flight"

    def setup(self, env: TargetEnv) -> None:
        super().setup(env)
        self.mirror = as_pinned(torch.zeros(self.capacity.max_batch_size, dtype=torch.int32))

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        n = layout.batch_size
        self.mirror[:n].copy_(torch.as_tensor(layout.kv_last_page_len[:n]))
        as_device(self.bufs[bucket]["kv_last_page_len"])[:n].copy_(self.mirror[:n], non_blocking=True)
        self.mirror[:n].fill_(self.capacity.template.page_size)  # BUG: rewritten while the copy is in flight


def test_the_driver_reports_the_rewrite_on_every_replay_at_the_bug_line() -> None:
    ops = FakeOps()
    target = MirrorRewrittenInFlight(buckets=(4,))
    bug = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if "# BUG: rewritten" in line)
    with Checker(layers=[StagingHook(ops=ops)]) as chk:
        drv = Driver(target, chk, device="cpu", seed=1)
        drv.setup()
        steps = [Step("capture", (1,), (9,), bucket=4), Step("replay", (1, 1), (5, 21)), Step("replay", (1,), (3,))]
        per_step = []
        for i, s in enumerate(steps):
            r = drv.execute(s, i)
            ops.complete()  # what the driver's synchronize at the end of each region does on a GPU
            per_step.append([f for f in r.findings if f.id == "FC204"])
    assert [len(f) for f in per_step] == [0, 1, 1]  # the capture's copies are graph nodes (FC203's), not tracked
    for i, (f,) in ((i, fs) for i, fs in enumerate(per_step) if fs):
        assert (f.location.file, f.location.line, f.location.step, f.location.region) == (
            __file__,
            bug,
            i,
            "prepare_replay",
        )
        assert f.location.target == "mirror-rewritten-in-flight"
        assert f.evidence["copy_code"].startswith("as_device(self.bufs[bucket]")


def test_fc204_is_listed_as_run_only_where_the_staging_layer_can_run() -> None:
    from flashcheck.campaign.checks import campaign_checks
    from flashcheck.driver import checks_run

    assert "FC204" in checks_run("races", watchdog=True, cuda=True)
    assert "FC204" not in checks_run("races", watchdog=False, cuda=False)  # CPU: the layer is skipped, never "passed"
    assert "FC204" not in checks_run("cheap", watchdog=True, cuda=True)
    assert "FC204" not in checks_run("all", watchdog=True, cuda=True)  # the stream hold is opt-in: layers="races"
    assert "FC204" in campaign_checks("races", cuda=True) and "FC204" not in campaign_checks("races")
