"""GPU tests of the runtime checker's torch layers (sync debug mode, gpu trace, CUPTI, allocator stats, capture).

Run on a CUDA machine: ``PYTHONPATH=src python -m pytest tests/gpu/test_runtime_gpu.py -m gpu -v``. Plain torch CUDA
ops only (no FlashInfer); a sync made inside a "C++ extension" is simulated by calling ``cudaDeviceSynchronize``
through ctypes on the CUDA runtime torch itself loaded.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from flashcheck.findings import Finding  # noqa: E402
from flashcheck.runtime import Checker  # noqa: E402


def here() -> int:
    return sys._getframe(1).f_lineno


@pytest.fixture(autouse=True)
def _clean_device() -> Iterator[None]:
    torch.cuda.synchronize()
    yield
    torch.cuda.synchronize()


def only(findings: list[Finding], check: str) -> Finding:
    assert [f.id for f in findings] == [check], "\n".join(str(f) for f in findings)
    return findings[0]


@pytest.mark.parametrize("layers", ["cheap", "all"])
def test_item_in_replay_fires_at_the_line(layers: str) -> None:
    x = torch.arange(16, device="cuda")
    with Checker(layers=layers) as chk:  # type: ignore[arg-type]
        assert chk.skipped_layers == {}
        with chk.region("replay", step=3):
            line = here() + 1
            x[5].item()
        f = only(chk.drain_findings(), "FC201")
    assert (f.location.file, f.location.line, f.location.step) == (__file__, line, 3)
    assert f.evidence["count"] == 1  # one .item(): its copy and its synchronize are one occurrence in every layer
    assert {"sync_debug", "gpu_trace"} <= set(f.evidence["layers"])  # type: ignore[arg-type]
    if layers == "all":
        assert "cupti" in f.evidence["layers"]  # type: ignore[operator]


def test_tolist_in_prepare_replay_is_one_finding_seen_by_every_layer() -> None:
    x = torch.arange(16, device="cuda")
    with Checker(layers="all") as chk:
        with chk.region("prepare_replay", step=0):
            line = here() + 1
            x[:4].tolist()
        f = only(chk.drain_findings(), "FC201")
    assert f.location.line == line
    assert set(f.evidence["layers"]) == {"cupti", "gpu_trace", "sync_debug"}  # type: ignore[arg-type]


def test_device_synchronize_in_replay_is_seen_by_gpu_trace() -> None:
    with Checker(layers="cheap") as chk:
        with chk.region("replay", step=1):
            line = here() + 1
            torch.cuda.synchronize()
        f = only(chk.drain_findings(), "FC201")
    assert f.location.line == line and "gpu_trace" in f.evidence["layers"]  # type: ignore[operator]


def test_device_synchronize_in_replay_is_seen_by_cupti_alone_at_its_line() -> None:
    with Checker(layers=["cupti"]) as chk:
        with chk.region("replay", step=2):
            line = here() + 1
            torch.cuda.synchronize()
        f = only(chk.drain_findings(), "FC201")
    assert f.evidence["layers"] == ["cupti"] and "cudaDeviceSynchronize" in f.message
    assert (f.location.step, f.location.file, f.location.line) == (2, __file__, line)  # CUPTI's callback: a stack
    assert f.evidence["count"] == 1  # the runtime call and the driver call inside it: one occurrence


def _loaded_cudart() -> ctypes.CDLL:
    with open("/proc/self/maps", encoding="utf-8") as fh:
        paths = sorted({ln.split()[-1] for ln in fh if "libcudart" in ln and ln.split()[-1].startswith("/")})
    if not paths:
        pytest.skip("torch did not load a shared libcudart (statically linked runtime): no extension to simulate")
    return ctypes.CDLL(paths[0])


def test_sync_inside_an_extension_is_seen_by_cupti_only_at_the_line_that_called_it() -> None:
    cudart = _loaded_cudart()
    with Checker(layers="all") as chk:
        with chk.region("replay", step=0):
            line = here() + 1
            assert cudart.cudaDeviceSynchronize() == 0  # what FlashInfer's C++ plan() does, invisible to torch
        f = only(chk.drain_findings(), "FC201")
    assert f.evidence["layers"] == ["cupti"] and "cudaDeviceSynchronize" in f.message
    assert f.location.line == line


def test_nonblocking_pageable_h2d_in_prepare_replay_is_seen_by_cupti() -> None:
    dst = torch.empty(1 << 20, device="cuda")
    src = torch.ones(1 << 20)  # pageable: the runtime stages it synchronously despite non_blocking=True
    with Checker(layers=["cupti"]) as chk:
        with chk.region("prepare_replay", step=0):
            line = here() + 1
            dst.copy_(src, non_blocking=True)
        f = only(chk.drain_findings(), "FC201")
    assert "Pageable -> Device" in f.message and f.location.line == line


def test_pageable_h2d_under_all_is_seen_by_cupti_with_dispatch_out_of_hot_regions() -> None:
    dst = torch.empty(1 << 20, device="cuda")
    src = torch.ones(1 << 20)
    with Checker(layers="all") as chk:
        assert chk.skipped_layers == {}
        with chk.region("prepare_replay", step=0):
            dst.copy_(src, non_blocking=True)
        f = only(chk.drain_findings(), "FC201")
    assert f.evidence["layers"] == ["cupti"] and "Pageable -> Device" in f.message


def test_pinned_nonblocking_h2d_in_prepare_replay_is_quiet() -> None:
    dst = torch.empty(1 << 20, device="cuda")
    src = torch.ones(1 << 20).pin_memory()
    with Checker(layers="all") as chk:
        for step in range(3):
            with chk.region("prepare_replay", step=step):
                dst.copy_(src, non_blocking=True)
        assert chk.drain_findings() == []


@pytest.mark.parametrize("layers", ["cheap", "all"])
def test_pinned_copy_captured_into_a_graph_fires_fc203(layers: str) -> None:
    static = torch.zeros(8, device="cuda")
    host = torch.ones(8).pin_memory()
    g = torch.cuda.CUDAGraph()
    with Checker(layers=layers) as chk:  # type: ignore[arg-type]
        with chk.region("capture"), torch.cuda.graph(g):
            line = here() + 1
            static.copy_(host, non_blocking=True)
            out = static * 2
        g.replay()
        torch.cuda.synchronize()
        findings = chk.drain_findings()
    f = next(f for f in findings if f.id == "FC203")
    assert f.location.line == line and "host-to-device" in f.message
    assert float(out.sum()) == 16.0


@pytest.mark.parametrize("layers", ["cheap", "all"])
def test_allocation_in_replay_fires_fc202(layers: str) -> None:
    with Checker(layers=layers) as chk:  # type: ignore[arg-type]
        with chk.region("replay", step=4):
            line = here() + 1
            scratch = torch.empty(1 << 16, device="cuda")
        f = only(chk.drain_findings(), "FC202")
    assert f.location.line == line and f.location.step == 4 and scratch.numel() == 1 << 16
    assert "gpu_trace" in f.evidence["layers"]  # type: ignore[operator]  # with its stack


def test_allocator_counters_witness_an_allocation_when_named() -> None:
    with Checker(layers=["gpu_trace", "alloc_stats"]) as chk:
        with chk.region("replay", step=4):
            scratch = torch.empty(1 << 16, device="cuda")
        f = only(chk.drain_findings(), "FC202")
    assert set(f.evidence["layers"]) >= {"gpu_trace", "alloc_stats"} and scratch.numel() == 1 << 16


@pytest.mark.parametrize("layers", ["cheap", "all"])
def test_clean_capture_and_replay_is_quiet(layers: str) -> None:
    static_in = torch.zeros(64, device="cuda")
    host_in = torch.zeros(64).pin_memory()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the graph, as the docs recommend
        static_out = static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with Checker(layers=layers) as chk:  # type: ignore[arg-type]
        with chk.region("capture"), torch.cuda.graph(g):
            static_out = static_in * 2 + 1
        for step in range(5):
            with chk.region("prepare_replay", step=step):
                host_in.fill_(float(step))
                static_in.copy_(host_in, non_blocking=True)
            with chk.region("replay", step=step):
                g.replay()
            with chk.checker_read():
                assert float(static_out[0]) == 2.0 * step + 1  # the checker's own read never counts
        assert chk.drain_findings() == []


def test_hot_path_plan_mode_flags_device_indptr_copied_to_host() -> None:
    indptr = torch.arange(9, device="cuda")
    with Checker(layers="cheap") as chk:  # plan() is on the per-step path: hot by default
        with chk.region("plan", step=0):
            line = here() + 1
            indptr.to("cpu")  # what plan() does with a device indptr
        f = only(chk.drain_findings(), "FC201")
    assert f.location.line == line and f.location.region == "plan"


def test_arena_on_cuda_overflow_fires_and_legit_use_is_quiet() -> None:
    with Checker(layers="cheap") as chk:
        ws = chk.arena.workspace("float", 1 << 20, device="cuda")
        chk.arena.arm()
        ws[: 1 << 19].fill_(3)
        findings, usage = chk.arena.scan(step=0)
        assert findings == [] and usage["float"] == (1 << 19, 1 << 20)
        chk.arena.arm()
        ws.as_strided(((1 << 20) + 64,), (1,))[(1 << 20) - 8 :].fill_(1)
        findings, usage = chk.arena.scan(step=1)
        f = only(findings, "FC302")
        assert f.evidence["bytes_written"] == 64 and usage["float"] == ((1 << 20) + 64, 1 << 20)
        assert chk.drain_findings() == findings


def test_arena_graphs_report_what_the_eager_scan_reports_and_catch_a_late_overflow() -> None:
    """The recorded arm and scan graphs agree with the eager path step for step, including an overflow written
    after the graphs took over (step 6) and the clean steps around it."""
    from flashcheck.runtime.arena import Arena

    arenas = [Arena(graphs=True), Arena(graphs=False)]
    views = [
        (
            a.workspace("float", (1 << 20) + 100, device="cuda", zero=False),
            a.workspace("int", 3 * 4096 + 5, device="cuda", kind="int", zero=False),
            a.workspace("sem", 8192, device="cuda", kind="engine"),
        )
        for a in arenas
    ]
    per_step = []
    for step in range(9):
        got = []
        for a, (f, i, sem) in zip(arenas, views, strict=True):
            a.arm()
            f[: 1000 * (step + 1)].fill_(step + 1)
            i[: 17 * (step + 1)].fill_(7)
            sem[step * 100].fill_(1)
            if step == 6:
                f.as_strided((f.numel() + 64,), (1,))[f.numel() - 8 :].fill_(1)
            got.append(a.scan(step))
        (f_graph, u_graph), (f_eager, u_eager) = got
        assert u_graph == u_eager, step
        assert [x.message for x in f_graph] == [x.message for x in f_eager], step
        per_step.append([x.id for x in f_graph])
    graphs = arenas[0].graphs
    assert graphs is not None and graphs.captures >= 4 and graphs.replays >= 8  # arm and scan, both parities
    assert per_step[6] == ["FC302"] and all(ids == [] for k, ids in enumerate(per_step) if k != 6)


def test_checker_off_restores_the_sync_debug_mode_and_replay() -> None:
    import torch.cuda._gpu_trace as gt

    mode = torch.cuda.get_sync_debug_mode()
    replay = torch.cuda.CUDAGraph.__dict__.get("replay")
    callbacks = list(gt.DeviceSynchronizationCallbacks.callback_list)
    with Checker(layers="all"):
        pass
    assert torch.cuda.get_sync_debug_mode() == mode
    assert torch.cuda.CUDAGraph.__dict__.get("replay") is replay
    assert gt.DeviceSynchronizationCallbacks.callback_list == callbacks
