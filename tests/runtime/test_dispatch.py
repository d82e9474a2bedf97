"""The dispatch layer on simulated device tensors: a broken D2H detector fails CPU CI."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

from flashcheck.runtime import Checker
from flashcheck.runtime.hooks.dispatch import DispatchHook, classify, residency
from flashcheck.runtime.simdevice import SimulatedDeviceTensor, as_device, as_pinned


def here() -> int:
    return sys._getframe(1).f_lineno


def dev(n: int = 8) -> SimulatedDeviceTensor:
    return as_device(torch.arange(n))


D2H_OPS: dict[str, Callable[[Any], object]] = {
    "item": lambda x: x[1].item(),
    "int": lambda x: int(x[2]),
    "tolist": lambda x: x.tolist(),
    "cpu": lambda x: x.cpu(),
    "to_cpu": lambda x: x.to("cpu"),
    "numpy": lambda x: x.numpy(),
    "nonzero": lambda x: x.nonzero(),
    "bool_mask": lambda x: x[x > 3],
    "copy_to_host": lambda x: torch.empty(8, dtype=x.dtype).copy_(x),
}


@pytest.mark.parametrize("op", sorted(D2H_OPS))
@pytest.mark.parametrize("region", ["replay", "prepare_replay"])
def test_d2h_of_a_device_tensor_in_a_hot_region_fires_at_the_line(op: str, region: str) -> None:
    x = dev()
    with Checker(layers=["dispatch"]) as chk:
        with chk.region(region, step=5):  # type: ignore[arg-type]
            line = here() + 1
            D2H_OPS[op](x)
        findings = chk.drain_findings()
    assert len(findings) == 1, findings
    (f,) = findings
    assert f.id == "FC201" and f.evidence["layers"] == ["dispatch"]
    # The offending line is the lambda's body; the caller's line is in the stack below it.
    assert (f.location.file, f.location.line, f.location.step) == (__file__, D2H_OPS[op].__code__.co_firstlineno, 5)
    assert any(fr.file == __file__ and fr.line == line for fr in f.stack)
    # source lines are read when the finding is made (stacks are captured without them): the user's line is quoted
    caller = next(fr for fr in f.stack if fr.file == __file__ and fr.line == line)
    assert caller.code == "D2H_OPS[op](x)"
    assert f.evidence["code"].startswith(f'"{op}": lambda x:')


@pytest.mark.parametrize("op", sorted(D2H_OPS))
def test_same_ops_on_host_tensors_are_quiet(op: str) -> None:
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("replay", step=0):
            D2H_OPS[op](torch.arange(8))
        assert chk.drain_findings() == []


def test_d2h_outside_hot_regions_or_inside_checker_read_is_quiet() -> None:
    x = dev()
    with Checker(layers=["dispatch"]) as chk:
        x.tolist()
        with chk.region("setup", step=0):
            x.tolist()
        with chk.region("capture", step=0):
            x.tolist()
        with chk.region("replay", step=0), chk.checker_read():
            x.tolist()
            x[0].item()
        assert chk.drain_findings() == []


def test_device_work_in_replay_is_quiet() -> None:
    x = dev()
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("replay", step=0):
            y = x * 2 + 1
            y[:4].copy_(x[4:])
            torch.repeat_interleave(x, 2, output_size=16)
        assert chk.drain_findings() == []
    assert isinstance(y, SimulatedDeviceTensor)


def test_eager_plan_is_checked_unless_declared_cold() -> None:
    x = dev()
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("plan", step=2):
            x.tolist()
        (f,) = chk.drain_findings()
    assert f.id == "FC201" and f.location.region == "plan"
    with Checker(layers=["dispatch"], cold_regions=("plan",)) as chk:
        with chk.region("plan", step=2):
            x.tolist()
        assert chk.drain_findings() == []


def test_pinned_copy_in_capture_fires_fc203_pageable_is_quiet() -> None:
    d = dev()
    with Checker(layers="cheap") as chk:  # cheap: the dispatch mode is pushed for capture regions only
        with chk.region("capture"):
            line = here() + 1
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)
            d.copy_(torch.ones(8, dtype=torch.int64), non_blocking=True)  # pageable: torch refuses it on a GPU
        (f,) = chk.drain_findings()
    assert f.id == "FC203" and f.location.line == line and f.location.region == "capture"
    assert "host-to-device" in f.message


def test_pinned_d2h_copy_in_capture_fires() -> None:
    d = dev()
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("capture"):
            as_pinned(torch.empty(8, dtype=torch.int64)).copy_(d, non_blocking=True)
        (f,) = chk.drain_findings()
    assert f.id == "FC203" and "device-to-host" in f.message


class FakeGraph:
    """Stands in for ``torch.cuda.CUDAGraph`` where CUDA cannot capture: its capture brackets only."""

    def capture_begin(self, pool: Any = None) -> None:
        self.began = pool

    def capture_end(self) -> None:
        self.ended = True


def capture_hook() -> DispatchHook:
    return DispatchHook("capture", graph_owner=FakeGraph, at_stream_capture=True)


def test_a_capture_region_pushes_the_mode_only_while_a_graph_captures() -> None:
    d, g = dev(), FakeGraph()
    with Checker(layers=[capture_hook()]) as chk:
        with chk.region("capture"):
            depth = [torch._C._len_torch_dispatch_stack()]
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)  # the plan's copy: eager
            g.capture_begin(pool="p")
            depth.append(torch._C._len_torch_dispatch_stack())
            line = here() + 1
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)
            g.capture_end()
            depth.append(torch._C._len_torch_dispatch_stack())
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)
        (f,) = chk.drain_findings()
    assert depth == [0, 1, 0] and (g.began, g.ended) == ("p", True)
    assert f.id == "FC203" and f.location.line == line and f.evidence["count"] == 1


def test_a_graph_capturing_outside_capture_regions_is_not_watched() -> None:
    g = FakeGraph()
    with Checker(layers=[capture_hook()]) as chk:
        with chk.region("replay"):
            g.capture_begin()
            assert torch._C._len_torch_dispatch_stack() == 0
            g.capture_end()
        g.capture_begin()
        assert torch._C._len_torch_dispatch_stack() == 0
        g.capture_end()
        assert chk.drain_findings() == []


def test_a_capture_that_never_ends_is_popped_with_its_region_and_the_methods_are_restored() -> None:
    begin, end = FakeGraph.capture_begin, FakeGraph.capture_end
    hook = capture_hook()
    with Checker(layers=[hook]) as chk:
        assert FakeGraph.capture_begin is not begin and FakeGraph.__dict__["capture_begin"].__wrapped__ is begin
        with chk.region("capture"), chk.region("plan"):
            FakeGraph().capture_begin()
            assert torch._C._len_torch_dispatch_stack() == 1
        assert torch._C._len_torch_dispatch_stack() == 0
    assert (FakeGraph.capture_begin, FakeGraph.capture_end) == (begin, end)
    FakeGraph().capture_begin()  # a graph captured after the checker left pushes nothing
    assert torch._C._len_torch_dispatch_stack() == 0


def test_a_capture_region_opened_inside_a_capture_is_watched_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.runtime.hooks import dispatch as dispatch_mod

    d, g = dev(), FakeGraph()
    with Checker(layers=[capture_hook()]) as chk:
        g.capture_begin()
        monkeypatch.setattr(dispatch_mod, "_stream_capturing", lambda: True)  # the stream captures already
        with chk.region("capture"):
            line = here() + 1
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)
        monkeypatch.setattr(dispatch_mod, "_stream_capturing", lambda: None)
        g.capture_end()
        (f,) = chk.drain_findings()
    assert f.id == "FC203" and f.location.line == line


def test_a_capture_on_another_thread_does_not_take_the_region_thread_s_watch() -> None:
    import threading

    d, g = dev(), FakeGraph()
    depth: list[int] = []

    def other() -> None:
        g.capture_begin()
        depth.append(torch._C._len_torch_dispatch_stack())
        g.capture_end()

    with Checker(layers=[capture_hook()]) as chk:
        with chk.region("capture"):
            t = threading.Thread(target=other)
            t.start()
            t.join()
            g.capture_begin()
            depth.append(torch._C._len_torch_dispatch_stack())
            d.copy_(as_pinned(torch.ones(8, dtype=torch.int64)), non_blocking=True)
            g.capture_end()
        (f,) = chk.drain_findings()
    assert depth == [0, 1] and f.id == "FC203"


def test_cheap_scope_keeps_the_mode_off_in_hot_regions() -> None:
    with Checker(layers="cheap") as chk:
        with chk.region("replay"):
            assert torch._C._len_torch_dispatch_stack() == 0
            dev().tolist()
        with chk.region("capture"):
            assert torch._C._len_torch_dispatch_stack() == 1
        assert chk.drain_findings() == []
    assert torch._C._len_torch_dispatch_stack() == 0


def test_nested_regions_push_the_mode_once() -> None:
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("prepare_replay"), chk.region("plan"):
            assert torch._C._len_torch_dispatch_stack() == 1
        assert torch._C._len_torch_dispatch_stack() == 0


def test_residency_and_classify() -> None:
    assert residency(dev()) == "device"
    assert residency(as_pinned(torch.ones(2))) == "pinned"
    assert residency(torch.ones(2)) == "pageable"
    assert residency(torch.empty(2, device="meta")) is None
    assert residency(3) is None
    assert classify("aten::add", (dev(),), {}) is None
    assert classify("aten::_to_copy", (torch.ones(2),), {"device": torch.device("cpu")}) is None
    hit = classify("aten::_to_copy", (dev(),), {"device": torch.device("cpu"), "pin_memory": True})
    assert hit is not None and hit[:2] == ("d2h_copy", "pinned")
    hit = classify("aten::_to_copy", (as_pinned(torch.ones(2)),), {"device": torch.device("cuda")})
    assert hit is not None and hit[:2] == ("h2d_copy", "pinned")


def test_a_failing_detector_is_reported_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.runtime.hooks import HookError
    from flashcheck.runtime.hooks import dispatch as mod

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("detector bug")

    monkeypatch.setattr(mod, "classify", boom)
    with pytest.raises(HookError, match="dispatch: RuntimeError: detector bug"), Checker(layers=["dispatch"]) as chk:
        with chk.region("replay"):
            dev().tolist()
        chk.drain_findings()


def test_install_is_idempotent() -> None:
    h = DispatchHook()
    with Checker(layers=[h]) as chk:
        h.install(chk)
        with chk.region("replay"):
            assert torch._C._len_torch_dispatch_stack() == 1
    h.uninstall()
    assert not h.installed


# ---- every op the layer watches, and the host memory kind of each copy, pinned --------------------------------------
SYNC_OPS: dict[str, Callable[[Any], object]] = {
    "masked_select": lambda x: torch.masked_select(x, x > 3),
    "unique": lambda x: torch.unique(x, sorted=True),
    "unique_consecutive": lambda x: torch.unique_consecutive(x, return_counts=True),
    "unique_dim": lambda x: torch.unique(x.reshape(2, -1), dim=0),
    "argwhere": lambda x: torch.argwhere(input=x),
    "repeat_interleave": lambda x: torch.repeat_interleave(x[:3]),
    "equal": lambda x: torch.equal(x, x),
}


@pytest.mark.parametrize("op", sorted(SYNC_OPS))
def test_each_data_dependent_op_on_a_device_tensor_fires_and_is_quiet_on_the_host(op: str) -> None:
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("replay", step=1):
            SYNC_OPS[op](dev())
        (f,) = chk.drain_findings()
        with chk.region("replay", step=2):
            SYNC_OPS[op](torch.arange(8))
        assert chk.drain_findings() == []
    assert f.id == "FC201" and f.location.line == SYNC_OPS[op].__code__.co_firstlineno
    assert "(data-dependent output size)" in f.message


def test_repeat_interleave_with_its_output_size_does_not_sync() -> None:
    reps = dev(3)
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("replay", step=1):
            torch.repeat_interleave(reps, output_size=3)
        assert chk.drain_findings() == []


DEV, PIN, HOST = as_device(torch.arange(4)), as_pinned(torch.arange(4)), torch.arange(4)
MASK, BYTES, LONG = torch.tensor([True, False]), torch.tensor([1, 0], dtype=torch.uint8), torch.tensor([0, 1])


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "expected"),
    [
        (
            "aten::_local_scalar_dense",
            (DEV,),
            {},
            ("d2h_copy", "pageable", "aten._local_scalar_dense (.item(), bool(), int() of a device tensor)"),
        ),
        ("aten::_local_scalar_dense", (HOST,), {}, None),
        ("aten::_local_scalar_dense", (), {}, None),
        (
            "aten::_to_copy",
            (DEV,),
            {"device": "cpu"},
            ("d2h_copy", "pageable", "aten._to_copy to CPU (.cpu(), .to('cpu'), .tolist(), .numpy())"),
        ),
        (
            "aten::_to_copy",
            (DEV,),
            {"device": "cpu", "pin_memory": True},
            ("d2h_copy", "pinned", "aten._to_copy to CPU (.cpu(), .to('cpu'), .tolist(), .numpy())"),
        ),
        ("aten::_to_copy", (DEV,), {}, None),  # a dtype cast on the device
        ("aten::_to_copy", (DEV,), {"device": "cuda:1"}, None),  # device to device
        (
            "aten::_to_copy",
            (HOST,),
            {"device": "cuda"},
            ("h2d_copy", "pageable", "aten._to_copy from pageable host memory to the device"),
        ),
        (
            "aten::_to_copy",
            (PIN,),
            {"device": "cuda:0"},
            ("h2d_copy", "pinned", "aten._to_copy from pinned host memory to the device"),
        ),
        ("aten::_to_copy", (HOST,), {"device": "cpu"}, None),
        ("aten::_to_copy", (HOST,), {"device": "meta"}, None),
        ("aten::_to_copy", (HOST,), {}, None),
        ("aten::_to_copy", (), {"device": "cpu"}, None),
        (
            "aten::copy_",
            (HOST, DEV),
            {},
            ("d2h_copy", "pageable", "aten.copy_ from the device into pageable host memory"),
        ),
        ("aten::copy_", (PIN, DEV), {}, ("d2h_copy", "pinned", "aten.copy_ from the device into pinned host memory")),
        (
            "aten::copy_",
            (DEV, HOST),
            {},
            ("h2d_copy", "pageable", "aten.copy_ from pageable host memory to the device"),
        ),
        ("aten::copy_", (DEV, PIN), {}, ("h2d_copy", "pinned", "aten.copy_ from pinned host memory to the device")),
        ("aten::copy_", (DEV, DEV), {}, None),
        ("aten::copy_", (HOST, PIN), {}, None),
        ("aten::copy_", (DEV,), {}, None),
        ("aten::nonzero", (DEV,), {}, ("sync", "unknown", "aten.nonzero (data-dependent output size)")),
        ("aten::nonzero", (HOST,), {}, None),
        ("aten::nonzero", (), {}, None),
        (
            "aten::repeat_interleave",
            (DEV,),
            {},
            ("sync", "unknown", "aten.repeat_interleave (data-dependent output size)"),
        ),
        ("aten::repeat_interleave", (DEV,), {"output_size": 4}, None),
        (
            "aten::index",
            (DEV, [MASK]),
            {},
            ("sync", "unknown", "aten.index with a boolean mask (data-dependent output size)"),
        ),
        (
            "aten::index",
            (DEV, [None, BYTES]),
            {},
            ("sync", "unknown", "aten.index with a boolean mask (data-dependent output size)"),
        ),
        ("aten::index", (DEV, [LONG]), {}, None),
        ("aten::index", (DEV, None), {}, None),
        ("aten::index", (DEV,), {}, None),
        ("aten::index", (HOST, [MASK]), {}, None),
        ("aten::index", (None, [MASK]), {}, None),
        ("aten::add", (DEV, DEV), {}, None),
    ],
)
def test_classify_each_op(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: Any) -> None:
    assert classify(op, args, kwargs) == expected


def test_residency_of_each_kind_of_tensor() -> None:
    assert (residency(DEV), residency(PIN), residency(HOST)) == ("device", "pinned", "pageable")
    assert residency(torch.empty(2, device="meta")) is None and residency([1, 2]) is None


_COMPILER_PROBE = """
import sys, torch
from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import dispatch
from flashcheck.runtime.simdevice import as_device

def d2h_in_a_hot_region():
    x = as_device(torch.arange(8))
    with Checker(layers=["dispatch"]) as chk:
        with chk.region("replay", step=1):
            x.tolist()
            mode = torch.utils._python_dispatch._get_current_dispatch_mode()
        return [f.id for f in chk.drain_findings()], hasattr(type(mode).__torch_dispatch__, "__wrapped__")

print(d2h_in_a_hot_region(), "torch._dynamo" in sys.modules)
import torch._dynamo  # as torch.compile loads it
print(d2h_in_a_hot_region(), "torch._dynamo" in sys.modules)
"""


def test_the_mode_loads_no_compiler_and_is_wrapped_as_torch_wraps_it_once_one_is_loaded() -> None:
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", _COMPILER_PROBE], capture_output=True, text=True, env=env, check=True)
    before, after = out.stdout.strip().splitlines()
    assert before == "(['FC201'], False) False"  # found, and torch's compiler (about 2 s to import) never loaded
    assert after == "(['FC201'], True) True"  # with a compiler in the process, torch's wrapper keeps it out
