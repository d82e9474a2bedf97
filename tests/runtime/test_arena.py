"""The workspace arena on CPU memory: overflow fires FC302, legitimate use stays quiet, usage is measured."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from flashcheck.errors import InvalidArgument
from flashcheck.runtime.arena import GUARD_PATTERNS, SENTINELS, Arena, WorkspaceUsage, _last_diff
from flashcheck.runtime.checks.workspace import WORKSPACE_WITHIN_BOUNDS


def write(ws: torch.Tensor, start: int, end: int, value: int = 7) -> None:
    ws[start:end] = value


def test_legit_use_is_quiet_and_measured() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("float", 10_000, device="cpu")
    assert ws.dtype == torch.uint8 and ws.numel() == 10_000
    a.arm()
    write(ws, 0, 6_001)
    findings, usage = a.scan(step=0)
    assert findings == [] and usage == {"float": (6_001, 10_000)}
    a.arm()
    write(ws, 0, 10_000)  # using every byte is fine
    assert a.scan(step=1) == ([], {"float": (10_000, 10_000)})


def test_write_past_the_end_fires_with_offsets() -> None:
    a = Arena(guard_bytes=1024)
    ws = a.workspace("int", 5_000, device="cpu", kind="int")
    a.arm()
    backing = ws.as_strided((5_000 + 1024,), (1,))  # the kernel's view of memory: it does not stop at the end
    write(backing, 4_000, 5_100)
    findings, usage = a.scan(step=3)
    (f,) = findings
    assert f.id == WORKSPACE_WITHIN_BOUNDS.id and f.name == "workspace-within-bounds" and f.location.step == 3
    assert f.evidence["workspace"] == "int" and f.evidence["bytes_written"] == 100
    assert (f.evidence["first_offset"], f.evidence["end_offset"]) == (5_000, 5_100)
    assert "100 byte(s) written in the guard zone after it" in f.message
    assert usage["int"] == (5_100, 5_000)


def test_write_before_the_start_fires() -> None:
    a = Arena(guard_bytes=256)
    a.workspace("a", 512, device="cpu")
    a.arm()
    ws_b = a.workspace("b", 512, device="cpu")
    base = ws_b.as_strided((512 + 256,), (1,), ws_b.storage_offset() - 256)
    write(base, 250, 256)  # 6 bytes just below b's start
    findings, _ = a.scan()
    (f,) = findings
    assert f.evidence["check"] == "guard-before" and f.evidence["workspace"] == "b"
    assert (f.evidence["first_offset"], f.evidence["end_offset"]) == (-6, 0)


def test_sentinel_equal_data_is_counted_across_two_arms() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("float", 8_192, device="cpu")
    a.arm()
    assert a.sentinel == SENTINELS[0]
    write(ws, 0, 8_192, SENTINELS[0])  # the kernel happens to write the sentinel byte everywhere
    _, usage = a.scan()
    assert usage["float"][0] == 0  # hidden in this step...
    a.arm()
    assert a.sentinel == SENTINELS[1]
    write(ws, 0, 8_192, SENTINELS[0])
    _, usage = a.scan()
    assert usage["float"][0] == 8_192  # ...but not in the next
    assert a.last_usage["float"].max_used == 8_192


def test_guard_pattern_alternates_so_pattern_equal_overflow_is_caught_next_step() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("w", 1_000, device="cpu")
    backing = ws.as_strided((1_256,), (1,))
    a.arm()
    write(backing, 1_000, 1_010, GUARD_PATTERNS[1])  # equals this arm's guard byte
    assert a.scan()[0] == []
    a.arm()
    write(backing, 1_000, 1_010, GUARD_PATTERNS[1])
    assert len(a.scan()[0]) == 1


def test_zero_kept_engine_workspace_is_never_sentinel_filled() -> None:
    a = Arena(guard_bytes=256)
    sem = a.workspace("semaphores", 4_096, device="cpu", kind="engine", zero=True)
    a.arm()
    assert int(sem.count_nonzero()) == 0  # still zero for the kernel
    write(sem, 100, 101, 1)
    _, usage = a.scan()
    assert usage["semaphores"] == (101, 4_096)  # last non-zero byte: a lower bound


def test_adopted_buffer_hwm_only_when_allowed() -> None:
    a = Arena()
    eng = torch.arange(64, dtype=torch.int32)
    a.adopt("engine_int", eng)
    a.adopt("scratch", torch.zeros(100, dtype=torch.uint8), sentinel=True)
    a.arm()
    assert eng.tolist() == list(range(64))  # untouched
    _, usage = a.scan()
    assert usage == {"engine_int": (-1, 256), "scratch": (0, 100)}


def test_reader_wraps_arm_and_scan_and_sink_receives_findings() -> None:
    entered: list[str] = []
    sunk: list[int] = []

    @contextlib.contextmanager
    def reader() -> Iterator[None]:
        entered.append("read")
        yield

    a = Arena(guard_bytes=256, reader=reader, sink=lambda fs: sunk.append(len(fs)))
    ws = a.workspace("w", 100, device="cpu")
    a.arm()
    ws.as_strided((300,), (1,))[150] = 1
    a.scan()
    assert entered == ["read", "read"] and sunk == [1]


def test_pinned_kind_on_a_cpu_machine_falls_back_to_host_memory() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("pinned", 300, device="cuda", kind="pinned")
    assert ws.device.type == "cpu"


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"kind": "bogus"}, "not one of"), ({"nbytes": -1}, "must be >= 0")],
)
def test_bad_arguments(kw: dict[str, object], match: str) -> None:
    a = Arena()
    args: dict[str, object] = {"nbytes": 10, "device": "cpu", **kw}
    with pytest.raises(InvalidArgument, match=match):
        a.workspace("w", **args)  # type: ignore[arg-type]


def test_duplicate_names_are_rejected() -> None:
    a = Arena()
    a.workspace("w", 10, device="cpu")
    with pytest.raises(InvalidArgument, match="already exists"):
        a.workspace("w", 10, device="cpu")


@pytest.mark.parametrize("offset", [0, 3], ids=["word-compare", "unaligned-byte-compare"])
@pytest.mark.parametrize("n", [1, 4_095, 4_096, 4_097, 3 * 4_096 + 5])
@pytest.mark.parametrize("last", [0, 1, "mid", "end"])
def test_last_diff_matches_a_plain_scan(n: int, last: int | str, offset: int) -> None:
    # offset 3: a view that cannot be read as 8-byte words (an adopted engine buffer may start anywhere)
    t = torch.full((n + offset,), 0xA5, dtype=torch.uint8)[offset:]
    k = {"mid": n // 2, "end": n}.get(str(last), last)
    assert isinstance(k, int)
    if k:
        t[k - 1] = 3
        t[: max(0, k - 10)] = 0
    assert _last_diff(t, 0xA5) == k


def test_graph_cache_records_a_key_on_its_second_sight_and_forgets_on_invalidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The policy of the CUDA-graph path, with the capture stubbed (CPU CI has no graphs; tests/gpu runs them)."""
    from flashcheck._cuda_graphs import GraphCache

    cache = GraphCache()
    recorded: list[str] = []
    replays: list[object] = []

    def fake_capture(build: object) -> tuple[object, str]:
        recorded.append("graph")
        return "graph", "static-out"

    monkeypatch.setattr(cache, "_capture", fake_capture)
    monkeypatch.setattr(torch._C._CUDAGraph, "replay", replays.append, raising=False)
    calls: list[int] = []

    def build() -> str:
        calls.append(1)
        return "eager-out"

    assert [cache.run("k", build) for _ in range(4)] == ["eager-out", "eager-out", "static-out", "static-out"]
    assert recorded == ["graph"] and len(calls) == 2 and replays == ["graph", "graph"]
    cache.invalidate()
    assert cache.run("k", build) == "eager-out" and len(calls) == 3


def test_graph_cache_stays_eager_for_a_key_whose_capture_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck._cuda_graphs import GraphCache

    cache = GraphCache()
    tries: list[int] = []
    monkeypatch.setattr(cache, "_capture", lambda build: tries.append(1))
    assert [cache.run("k", lambda: 5) for _ in range(4)] == [5, 5, 5, 5]
    assert tries == [1] and cache.replays == 0


def test_graph_cache_records_no_more_than_max_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `max_graphs` recorded keys, new keys run eagerly (the padded reference bounds its graphs so)."""
    from flashcheck._cuda_graphs import GraphCache

    cache = GraphCache(max_graphs=1)
    monkeypatch.setattr(cache, "_capture", lambda build: ("graph", "static-out"))
    monkeypatch.setattr(torch._C._CUDAGraph, "replay", lambda g: None, raising=False)
    assert [cache.run("a", lambda: "eager") for _ in range(3)] == ["eager", "eager", "static-out"]
    assert [cache.run("b", lambda: "eager") for _ in range(3)] == ["eager", "eager", "eager"]


def test_cpu_arena_never_records_graphs() -> None:
    a = Arena()
    ws = a.workspace("float", 10_000, device="cpu")
    for _ in range(4):
        a.arm()
        ws[:10].fill_(1)
        a.scan()
    assert a.graphs is not None and a.graphs.captures == 0 and a.graphs.replays == 0


# ---- the finding, the usage record and the arena's arithmetic, pinned ----------------------------------------------
def test_an_overflow_finding_and_usage_in_full() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("tmp", 1_000, device="cpu", kind="int")
    a.arm()
    ws.as_strided((1_000 + 256,), (1,))[990:1_010] = 7
    (f,) = a.scan(step=4)[0]
    assert f.message == (
        "workspace `tmp` (int, 1,000 bytes) overflowed: 10 byte(s) written in the guard zone after it, at offsets "
        "[1,000, 1,010)"
    )
    assert f.hint.startswith("the kernel needs more workspace than was allocated")
    assert (f.kind, f.location.step) == ("property", 4)
    assert f.evidence == {
        "check": "guard-after",
        "workspace": "tmp",
        "workspace_kind": "int",
        "allocated": 1_000,
        "bytes_written": 10,
        "first_offset": 1_000,
        "end_offset": 1_010,
    }
    assert a.last_usage["tmp"] == WorkspaceUsage("tmp", "int", 1_000, 1_010, 1_010, 10)
    a.arm()
    ws[:10] = 7
    assert a.scan(step=5) == ([], {"tmp": (10, 1_000)})
    assert a.last_usage["tmp"] == WorkspaceUsage("tmp", "int", 1_000, 10, 1_010, 10)  # the maximum is kept


def test_a_whole_guard_zone_written_before_the_start_says_it_may_reach_further() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("w", 512, device="cpu")
    a.arm()
    ws.as_strided((512 + 256,), (1,), ws.storage_offset() - 256)[:256] = 1
    (f,) = a.scan()[0]
    assert f.message == (
        "workspace `w` (float, 512 bytes) overflowed: 256 byte(s) written in the guard zone before it, at offsets "
        "[-256, 0) (the whole guard zone was written: the overflow may reach further)"
    )
    assert f.hint.startswith("something writes below the workspace's start") and f.location.step is None
    assert a.last_usage["w"].overflow_bytes == 0  # below the start: not more than was allocated


@pytest.mark.parametrize(("asked", "rounded"), [(0, 0), (1, 256), (256, 256), (257, 512)])
def test_guard_zones_are_rounded_up_to_256_bytes(asked: int, rounded: int) -> None:
    assert Arena(guard_bytes=asked).guard_bytes == rounded


def test_a_negative_guard_is_rejected() -> None:
    with pytest.raises(InvalidArgument, match=r"^guard_bytes must be >= 0, got -1$"):
        Arena(guard_bytes=-1)


def test_a_new_workspace_is_zeroed_and_measured_before_the_first_arm() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("z", 100, device="cpu")
    a.workspace("raw", 100, device="cpu", zero=False)
    assert (a.sentinel, a.names()) == (None, ["z", "raw"])
    assert ws.dtype == torch.uint8 and ws.numel() == 100 and int(ws.sum()) == 0
    ws[:40] = 1
    assert a.scan()[1] == {"z": (40, 100), "raw": (-1, 100)}  # not filled with anything known: not measured
    a.arm()
    assert a.sentinel == SENTINELS[0]
    a.arm()
    assert a.sentinel == SENTINELS[1]


def test_adopted_buffers() -> None:
    a = Arena()
    a.adopt("engine", torch.zeros(4, 8, dtype=torch.float16), sentinel=True)
    a.adopt("kept", torch.zeros(16, dtype=torch.int32))
    a.arm()
    assert a.scan()[1] == {"engine": (0, 64), "kept": (-1, 64)}
    assert a.last_usage["engine"].kind == "engine"
    with pytest.raises(InvalidArgument, match=r"^workspace 'kept' already exists; names identify workspaces"):
        a.adopt("kept", torch.zeros(4))
    with pytest.raises(InvalidArgument, match=r"^adopted buffer 'x' must be contiguous to be viewed as bytes$"):
        a.adopt("x", torch.zeros(4, 4).t())


def test_ramps_are_one_to_n_and_the_cache_starts_over_at_256_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.runtime import arena

    monkeypatch.setattr(arena, "_RAMPS", {})
    r = arena._ramp(5, torch.device("cpu"))
    assert r.dtype == torch.int64 and r.tolist() == [1, 2, 3, 4, 5]
    assert arena._ramp(5, "cpu") is r and list(arena._RAMPS) == [("cpu", 5)]
    for n in range(6, 6 + 255):
        arena._ramp(n, "cpu")
    assert len(arena._RAMPS) == 256
    arena._ramp(1000, "cpu")
    assert list(arena._RAMPS) == [("cpu", 1000)]


@pytest.mark.parametrize("offset", [0, 8, 3])
def test_dirty_blocks_of_each_alignment(offset: int) -> None:
    from flashcheck.runtime.arena import _dirty_blocks

    t = torch.full((3 * 4096 + offset,), 0xA5, dtype=torch.uint8)[offset:]
    t[4096 + 17] = 0x5A
    assert _dirty_blocks(t, 0xA5).tolist() == [False, True, False]
    assert _dirty_blocks(t, 0x5A).tolist() == [True, True, True]


def test_diff_span_of_a_clean_and_a_dirty_guard() -> None:
    from flashcheck.runtime.arena import _diff_span

    t = torch.full((64,), 0xC3, dtype=torch.uint8)
    assert _diff_span(t, 0xC3) == (0, 0, 0)
    t[5], t[9] = 1, 2
    assert _diff_span(t, 0xC3) == (2, 5, 10)


def test_an_arena_without_graphs_keeps_none() -> None:
    a = Arena(graphs=False)
    a.workspace("w", 10, device="cpu")  # adding a workspace drops recorded graphs: none to drop
    a.adopt("e", torch.zeros(2))
    assert a.graphs is None and Arena().graphs is not None


def test_an_empty_workspace_is_allowed_and_uses_nothing() -> None:
    a = Arena(guard_bytes=256)
    a.workspace("empty", 0, device="cpu")
    a.arm()
    assert a.scan() == ([], {"empty": (0, 0)})


@pytest.mark.parametrize("kind", ["float", "pinned"])
def test_a_workspace_is_bytes_between_two_guard_zones(kind: str) -> None:
    a = Arena(guard_bytes=256)
    a.arm()
    a.arm()  # workspaces added after any number of arms get the current guard pattern
    ws = a.workspace("w", 1_000, device="cpu", kind=kind)  # type: ignore[arg-type]
    assert ws.dtype == torch.uint8 and ws.numel() == 1_000
    assert ws.untyped_storage().nbytes() == 1_000 + 2 * 256 and ws.storage_offset() == 256


def test_an_explicit_keep_zero_overrides_the_default_of_the_kind() -> None:
    a = Arena(guard_bytes=256)
    kept = a.workspace("kept", 64, device="cpu", kind="float", keep_zero=True)
    filled = a.workspace("filled", 64, device="cpu", kind="engine", keep_zero=False)
    a.arm()
    assert int(kept.sum()) == 0 and set(filled.tolist()) == {SENTINELS[0]}


def test_overflow_offsets_inside_the_guard_zones_and_the_step_of_each_side() -> None:
    a = Arena(guard_bytes=256)
    ws = a.workspace("w", 512, device="cpu")
    a.arm()
    whole = ws.as_strided((512 + 2 * 256,), (1,), ws.storage_offset() - 256)  # before guard, usable, after guard
    whole[250:252] = 1  # 6 and 5 bytes below the start
    whole[256 + 512 + 5 : 256 + 512 + 9] = 1  # offsets 517..520 past the start
    after, before = a.scan(step=3)[0]
    assert (after.evidence["first_offset"], after.evidence["end_offset"], after.location.step) == (517, 521, 3)
    assert (before.evidence["first_offset"], before.evidence["end_offset"], before.location.step) == (-6, -4, 3)
