"""The error table classifies what a target raises by cause: one row per cause, first match wins, and anything the
table does not name is a finding (FC250) because the step was inside the target's capacity."""

from __future__ import annotations

import pytest

from flashcheck.findings import Location
from flashcheck.targets.classify import classify_exception, finding_from_exception, is_device_fault


class MissingJITCacheError(RuntimeError):
    """FlashInfer's exception for a kernel absent from the prebuilt JIT cache (matched by class name)."""


class BackendError(NotImplementedError):
    """A subclass of a type the table names: the table matches the whole MRO."""


@pytest.mark.parametrize(
    ("exc", "verdict", "check", "poisons"),
    [
        # kernel faults poison the context, whatever the exception type
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "finding", "FC250", True),
        (RuntimeError("CUDA error: device-side assert triggered"), "finding", "FC250", True),
        (RuntimeError("CUDA ERROR: AN ILLEGAL MEMORY ACCESS WAS ENCOUNTERED"), "finding", "FC250", True),  # any case
        (RuntimeError("CUDA error: unspecified launch failure"), "finding", "FC250", True),
        (ValueError("uncorrectable ECC error encountered"), "finding", "FC250", True),
        # out of memory is not a fault: the context survives
        (RuntimeError("CUDA error: out of memory"), "finding", "FC250", False),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "finding", "FC250", False),
        # planner overflow
        (RuntimeError("Buffer overflow when allocating memory for tmp_v"), "finding", "FC302", False),
        (ValueError("request exceeds max_total_num_works"), "finding", "FC302", False),
        # the machine, by message
        # a missing architecture is not sticky: torch raises it as a CUDA error, the context stays usable
        (
            RuntimeError("CUDA error: no kernel image is available for execution on the device"),
            "environment",
            None,
            False,
        ),
        (RuntimeError("CUDA error: an unknown error"), "finding", "FC250", True),
        (RuntimeError("fa3 requires SM90"), "environment", None, False),
        (RuntimeError("Ninja build failed. Ninja output:"), "environment", None, False),
        # the machine, by type (the class name or any base's)
        (MissingJITCacheError("kernel xyz"), "environment", None, False),
        (NotImplementedError("workspace_size is not implemented for cudnn"), "environment", None, False),
        (BackendError("no such layout"), "environment", None, False),
        (ModuleNotFoundError("No module named 'cutlass'"), "environment", None, False),
        # everything else on a valid step is a bug, a backend's ValueError included
        (ValueError("too many values to unpack (expected 2)"), "finding", "FC250", False),
        (ValueError("expected kv_indptr to be on the host"), "finding", "FC250", False),
        (ValueError("The batch size should be fixed in cudagraph mode"), "finding", "FC250", False),
        (TypeError("unexpected keyword argument 'out'"), "finding", "FC250", False),
        (IndexError("index 7 is out of bounds for dimension 0 with size 4"), "finding", "FC250", False),
    ],
)
def test_each_row_of_the_table(exc: BaseException, verdict: str, check: str | None, poisons: bool) -> None:
    c = classify_exception(exc)
    assert (c.verdict, c.check_id, c.poisons_context) == (verdict, check, poisons)
    assert c.reason
    assert is_device_fault(exc) is poisons


def test_the_first_matching_row_gives_the_reason() -> None:
    # the type's name is part of the text the table searches: the missing-kernel row matches before the type row
    assert (
        classify_exception(MissingJITCacheError("kernel xyz")).reason == "the kernel is not available on this machine"
    )
    assert classify_exception(BackendError("no such layout")).reason.startswith("the backend does not implement")


def test_an_exception_the_table_does_not_name_is_raised_on_valid_input() -> None:
    c = classify_exception(ValueError("too many values to unpack (expected 2)"))
    assert c.reason.startswith("raised on valid input")


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # the traceback is the point
        return e


def test_a_target_error_finding_carries_the_type_the_first_line_and_the_traceback() -> None:
    exc = _raise(ValueError("bad indptr\nsecond line"))
    loc = Location(step=4, target="t")
    f = finding_from_exception(exc, classify_exception(exc), loc)
    assert (f.id, f.name, f.kind) == ("FC250", "target-raised", "runtime")
    assert f.message == "ValueError: bad indptr"
    assert f.location == loc
    assert f.hint.startswith("raised on valid input")
    assert f.evidence == {"check": "exception", "type": "ValueError", "verdict": "finding"}
    (frame,) = f.stack
    assert frame.function == "_raise" and frame.file == __file__ and frame.line > 0 and frame.code == "raise exc"


def test_an_overflow_is_a_workspace_finding_and_long_messages_are_cut() -> None:
    exc = _raise(RuntimeError("Buffer overflow when allocating memory " + "x" * 1000))
    f = finding_from_exception(exc, classify_exception(exc), Location())
    assert (f.id, f.name, f.kind) == ("FC302", "workspace-within-bounds", "property")
    assert f.message == "RuntimeError: " + ("Buffer overflow when allocating memory " + "x" * 1000)[:400]


def test_an_empty_message_gives_the_type_alone() -> None:
    exc = _raise(RuntimeError())
    f = finding_from_exception(exc, classify_exception(exc), Location())
    assert f.message == "RuntimeError: " and f.id == "FC250"


def test_a_frame_without_source_has_empty_code() -> None:
    try:
        exec(compile("raise ValueError('from generated code')", "<generated>", "exec"))
    except ValueError as exc:
        f = finding_from_exception(exc, classify_exception(exc), Location())
    assert [(fr.file, fr.code) for fr in f.stack][-1] == ("<generated>", "")
