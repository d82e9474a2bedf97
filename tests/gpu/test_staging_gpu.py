"""FC204 and async pressure on a real GPU: a target that rewrites a pinned mirror while its non_blocking copy is in
flight is found by the staging layer on every replay, and with ``--async-pressure-us`` as an FC303 divergence too;
the built-in targets stay clean with the staging layer on (and it did track their copies)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest

from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.isolation import IsolatedDriver
from flashcheck.known import split_known
from flashcheck.session import open_session
from flashcheck.targets.registry import GPU_TARGETS, make_target

QUALITY = Path(__file__).resolve().parents[1] / "quality"
sys.path.insert(0, str(QUALITY))
from faulty_engine_gpu import PinnedMirrorRewrittenInFlight  # noqa: E402

STEPS = int(os.environ.get("FLASHCHECK_GPU_STEPS", "40"))
SPEC = f"faulty_engine_gpu:{PinnedMirrorRewrittenInFlight.__name__}"


def test_real_pinned_memory_write_in_flight_fires_and_after_the_event_is_quiet() -> None:
    import torch

    from flashcheck.runtime import Checker

    src = torch.zeros(1 << 20, dtype=torch.int32).pin_memory()
    dst = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
    with Checker(layers=["staging"]) as chk:
        with chk.region("prepare_replay", step=0):
            dst.copy_(src, non_blocking=True)
            src[:8].fill_(1)  # in flight: the layer holds the copy for 3 ms
        (f,) = chk.drain_findings()
        assert f.id == "FC204" and f.evidence["direction"] == "h2d" and f.evidence["access"] == "write"
        assert f.location.file == __file__ and f.evidence["copy_line"].startswith(__file__)
        with chk.region("prepare_replay", step=1):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            src[:8].fill_(2)  # after the event: quiet
        assert chk.drain_findings() == []


def test_real_device_to_host_read_before_the_event_fires() -> None:
    import torch

    from flashcheck.runtime import Checker

    dev = torch.arange(1 << 20, dtype=torch.int32, device="cuda")
    host = torch.empty(1 << 20, dtype=torch.int32).pin_memory()
    with Checker(layers=["staging"]) as chk:
        with chk.region("plan", step=0):
            host.copy_(dev, non_blocking=True)
            head = host[:4].tolist()  # read before the copy arrived
        (f,) = chk.drain_findings()
        assert f.evidence["direction"] == "d2h" and f.evidence["access"] == "read", f.evidence
        with chk.region("plan", step=1):
            host.copy_(dev, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            head = host[:4].tolist()
        assert chk.drain_findings() == [] and head == [0, 1, 2, 3]


def test_the_staging_layer_reports_every_racing_rewrite_at_the_bug_line() -> None:
    """Each replay either reports FC204 at the BUG line, or its copy had completed before the write (a sync inside
    the step drained the held stream): then the graph read this step's values and the output is right (no FC303).
    A replay with a wrong output and no FC204 is a race the layer missed. Most replays race (the stream hold)."""
    src = Path(inspect.getsourcefile(PinnedMirrorRewrittenInFlight) or "")
    replays = hits = 0
    with IsolatedDriver(SPEC, device="cuda", layers="races", seed=5, step_timeout=60.0) as drv:
        for i, s in enumerate(random_steps(drv.cap, STEPS, seed=99)):
            r = drv.execute(s, i)
            assert r.rejected is None, r.rejected
            if s.op != "replay":
                continue
            replays += 1
            fc204 = [f for f in r.findings if f.id == "FC204"]
            if not fc204:
                assert not any(f.id == "FC303" for f in r.findings), f"replay step {i}: a race FC204 did not see"
                continue
            hits += 1
            f = fc204[0]
            assert f.location.file == str(src) and f.location.region == "prepare_replay", f.location
            assert "BUG" in src.read_text().splitlines()[(f.location.line or 0) - 1]
            assert f.evidence["access"] == "write" and f.evidence["copy_stack"], f.evidence
    assert replays > 0 and hits >= 0.75 * replays, (hits, replays)


def test_async_pressure_turns_the_race_into_an_fc303_divergence() -> None:
    found = None
    with IsolatedDriver(
        SPEC, device="cuda", layers="cheap", seed=5, step_timeout=60.0, async_pressure_us=2000.0
    ) as drv:
        for i, s in enumerate(random_steps(drv.cap, STEPS, seed=99)):
            r = drv.execute(s, i)
            found = next((f for f in r.findings if f.id == "FC303"), None)
            if found is not None:
                break
    assert found is not None, f"no FC303 within {STEPS} steps under 2000 us of async pressure"
    assert found.location.region == "replay"


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_clean_builtin_targets_stay_clean_with_the_staging_layer_and_pressure(name: str) -> None:
    target = make_target(name)
    with open_session(target, layers="races", seed=7, async_pressure_us=500.0) as drv:
        staging = drv.checker.hook("staging")  # type: ignore[attr-defined]
        assert staging is not None and staging.installed, "the staging layer did not run"
        for i, s in enumerate(random_steps(target.capacity, STEPS, seed=1234)):
            r = drv.execute(s, i)
            unexpected, _known = split_known(r.findings, name)
            assert not unexpected, f"{name} step {i} {s.to_dict()}:\n" + "\n".join(map(str, unexpected))
        assert staging.tracked > 0, "no pinned non_blocking copy was tracked: the clean verdict would be vacuous"
