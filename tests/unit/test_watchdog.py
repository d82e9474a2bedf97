"""The step watchdog on its own: one shared timer thread, arm generations, and the hang file rewritten in place."""

from __future__ import annotations

import faulthandler
import os
import threading
import time
import warnings
from pathlib import Path

import pytest

from flashcheck.watchdog import StepHung, Watchdog, read_hang_file


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def test_a_step_that_outlives_its_timeout_is_interrupted_with_the_stacks() -> None:
    wd = Watchdog(0.2, grace=10.0)
    with pytest.raises(StepHung):
        wd.arm("step 3 (replay bs=4)")
        try:
            _spin(5.0)
        finally:
            wd.disarm()
    assert wd.fired and any("_spin" in f.function for frames in wd.stacks.values() for f in frames)
    wd.close()


def test_a_step_that_finishes_in_time_is_never_interrupted() -> None:
    wd = Watchdog(0.2, grace=10.0)
    for i in range(50):
        wd.arm(f"step {i}")
        wd.disarm()
    _spin(0.5)  # well past every deadline armed above
    assert not wd.fired
    wd.close()


def test_an_expiry_of_an_earlier_arm_does_not_interrupt_a_later_step() -> None:
    wd = Watchdog(0.2, grace=10.0)
    wd.arm("step 1")
    first = wd._gen
    wd.disarm()
    wd.arm("step 2", scale=50.0)  # 10 s for this one
    try:
        wd._expire(first)  # step 1's expiry, taken off the timer just before its disarm: it comes late
        _spin(0.5)
    finally:
        wd.disarm()
    assert not wd.fired
    wd.close()


def test_a_hang_file_that_cannot_be_written_leaves_no_timer_armed(tmp_path: Path) -> None:
    wd = Watchdog(0.2, grace=10.0, hang_file=tmp_path / "missing" / "hang.txt")
    with pytest.raises(OSError):
        wd.arm("step 1")
    _spin(0.5)  # past the deadline the failed arm would have set
    assert not wd.fired


def test_every_watchdog_of_the_process_shares_one_timer_thread() -> None:
    a, b = Watchdog(30.0), Watchdog(30.0)
    a.arm("a")
    b.arm("b")
    try:
        assert [t.name for t in threading.enumerate()].count("flashcheck-watchdog") == 1
    finally:
        a.close()
        b.close()


def test_the_hang_file_holds_the_current_step_and_no_dump_until_one_is_written(tmp_path: Path) -> None:
    hang = tmp_path / "hang.txt"
    wd = Watchdog(30.0, hang_file=hang)
    wd.arm("step 1 (capture bs=8) of decode-tc")
    wd.disarm()
    wd.arm("step 2 (replay)")  # rewritten in place: nothing of the longer label before it is left
    wd.disarm()
    text = hang.read_text()
    assert text.splitlines()[0].rstrip() == "flashcheck: step hung: step 2 (replay) (timeout 30s)"
    assert read_hang_file(hang) is None  # a header alone is no hang
    assert wd._fd is not None  # the C-level watchdog writes its dump at this descriptor's offset
    os.write(wd._fd, b'Thread 0x1 (most recent call first):\n  File "engine.py", line 7 in replay\n')
    label, stacks = read_hang_file(hang) or ("", "")
    assert label == "step 2 (replay) (timeout 30s)" and "engine.py" in stacks
    wd.arm("step 3")  # a dump of an earlier step (no hard exit) is dropped, not relabelled as this step's
    wd.disarm()
    assert read_hang_file(hang) is None
    wd.close()
    assert not hang.exists()


def test_a_session_removes_its_hang_file_when_it_ends(tmp_path: Path) -> None:
    from flashcheck.fuzzing.scenarios import random_steps
    from flashcheck.session import open_session
    from flashcheck.targets.reference import ReferenceTarget

    hang = tmp_path / "hang.txt"
    t = ReferenceTarget(max_kv_len=256, chunk=32, max_pages=256)
    with open_session(t, device="cpu", layers="off", step_timeout=30.0, hang_file=hang) as drv:
        assert drv.execute(random_steps(t.capacity, 1, seed=1)[0], 0).findings == []
        assert read_hang_file(hang) is None and hang.exists()  # open for the session, holding a header
    assert not hang.exists()


def test_the_c_level_timer_is_kept_across_steps_never_fires_while_idle_and_fires_on_a_stuck_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arms: list[float] = []
    real = faulthandler.dump_traceback_later

    def counted(timeout: float, **kw: object) -> None:
        arms.append(timeout)
        real(timeout, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(faulthandler, "dump_traceback_later", counted)
    hang = tmp_path / "hang.txt"
    wd = Watchdog(1.0, grace=0.25, hang_file=hang)
    for i in range(20):
        wd.arm(f"step {i}")
        wd.disarm()
    assert len(arms) == 1, arms  # one C-level arm serves every quick step (each re-arm starts and joins a thread)
    assert arms[0] == pytest.approx(1.375)  # the limit plus grace, and a tenth of the timeout plus grace
    time.sleep(1.6)  # idle past that deadline: the timer thread cancels it first
    assert read_hang_file(hang) is None, "an idle watchdog wrote a hang"
    wd.arm("step stuck")
    try:
        time.sleep(1.6)  # a C call that the Python-level tier cannot interrupt
        _spin(0.2)  # where the StepHung it raised meanwhile is delivered
    except StepHung:
        pass
    finally:
        wd.disarm()
    label, stacks = read_hang_file(hang) or ("", "")
    assert label.startswith("step stuck") and "test_watchdog.py" in stacks
    wd.close()


def test_a_child_forked_after_a_step_arms_its_own_timer_and_exits(tmp_path: Path) -> None:
    """The kept C-level timer is cancelled across a fork (a child would inherit its thread's lock held and hang in
    its first arm or at exit) and re-armed in the parent for what was left of it."""
    wd = Watchdog(5.0, hang_file=tmp_path / "parent.txt")
    wd.arm("parent step")
    wd.disarm()
    time.sleep(0.2)  # the timer thread is waiting on the kept timer
    with warnings.catch_warnings():  # Python 3.12+: forking a process that runs threads is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: a step of its own, then a normal exit
        code = 1
        try:
            child = Watchdog(5.0, hang_file=tmp_path / "child.txt")
            child.arm("child step")
            child.disarm()
            child.close()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung arming its watchdog")
    assert os.waitstatus_to_exitcode(status) == 0
    wd.arm("parent step after the fork")  # the parent's timer is still usable
    wd.disarm()
    wd.close()
