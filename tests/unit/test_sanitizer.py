"""compute-sanitizer's report is parsed into (what, kernel) pairs; a missing tool or an unknown tool name is a clear
error. The sanitizer itself runs on GPU nodes only."""

from __future__ import annotations

import pytest

from flashcheck.errors import EnvironmentUnavailable, InvalidArgument
from flashcheck.sanitizer import find_sanitizer, parse_report, run_under_sanitizer

MEMCHECK = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 2 bytes
=========     at void flashinfer::BatchDecodeWithPagedKVCacheKernel<128>(half *, int *)+0x1a30 in decode.cuh:412
=========     by thread (3,0,0) in block (17,0,0)
=========     Address 0x7f3a00001000 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call
========= ERROR SUMMARY: 1 error
"""


def test_parse_report_names_the_kernel() -> None:
    r = parse_report(MEMCHECK)
    assert r.count == 1
    assert r.errors == (
        (
            "Invalid __global__ read of size 2 bytes",
            "void flashinfer::BatchDecodeWithPagedKVCacheKernel<128>(half *, int *)",
            "Address 0x7f3a00001000 is out of bounds",
        ),
    )


def test_repeated_errors_are_grouped_with_their_count() -> None:
    one = MEMCHECK.split("=========\n", maxsplit=1)[0].replace("========= COMPUTE-SANITIZER\n", "")
    other = one.replace("read of size 2", "write of size 4").replace("0x7f3a00001000", "0x7f3a00002000")
    r = parse_report("========= COMPUTE-SANITIZER\n" + one * 3 + other + "========= ERROR SUMMARY: 4 errors\n")
    assert r.count == 4
    kernel = "void flashinfer::BatchDecodeWithPagedKVCacheKernel<128>(half *, int *)"
    assert r.distinct() == [
        ("Invalid __global__ read of size 2 bytes", kernel, "Address 0x7f3a00001000 is out of bounds", 3),
        ("Invalid __global__ write of size 4 bytes", kernel, "Address 0x7f3a00002000 is out of bounds", 1),
    ]


def test_parse_clean_report() -> None:
    r = parse_report("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert r.count == 0 and r.errors == ()


def test_unknown_tool_and_missing_sanitizer(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    with pytest.raises(InvalidArgument, match="choose one of memcheck"):
        run_under_sanitizer("repro.json", "leakcheck")
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr("os.access", lambda p, m: False)
    with pytest.raises(EnvironmentUnavailable, match="compute-sanitizer not found"):
        find_sanitizer()
