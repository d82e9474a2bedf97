"""A deterministic synthetic run directory (static, runtime and property findings; samples with workspace usage;
environment; run errors), a baseline run for ``--compare``, and fixed check pages so goldens do not move when a
real check's page is edited."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flashcheck.check import Check
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Confidence, Finding, Frame, Location, Severity, atomic_write_text, save_findings
from flashcheck.rundir import Sample

STARTED = 1767225600.0  # 2026-01-01 00:00:00 UTC
TARGET = "flashinfer-paged"

ENVIRONMENT = {
    "python": "3.11.9",
    "torch": "2.13.0+cu130",
    "flashinfer": "0.6.13",
    "device": "NVIDIA H100 80GB HBM3",
    "cuda": "13.0",
    "platform": "Linux-6.8.0-x86_64-with-glibc2.36",
    "flashcheck": "0.1.0",
}

_PAGES = {
    "FC102": (
        "host-sync-in-graph-capture",
        "static",
        "A host synchronisation (.item(), .cpu(), .tolist()) is "
        "reachable from code that runs under CUDA graph capture.",
    ),
    "FC203": (
        "persistent-buffer-reallocated",
        "runtime",
        "A buffer a captured graph reads was reallocated or rebound before the graph replayed.",
    ),
    "FC205": ("plan-outside-replay-window", "runtime", "plan() ran on a side stream the replay does not wait for."),
    "FC301": (
        "csr-well-formed",
        "property",
        "Paged CSR metadata (qo/kv indptr, kv indices, last_page_len) is well formed before a kernel reads it.",
    ),
    "FC302": ("replay-matches-eager", "property", "A replayed graph produces the output an eager run produces."),
    "FC304": ("workspace-within-bounds", "property", "The bytes a plan needs fit in the workspace it was given."),
}


def fake_get_check(id_or_name: str) -> Check:
    key = id_or_name.upper()
    if key not in _PAGES:
        raise InvalidArgument(f"unknown check {id_or_name!r}")
    name, kind, summary = _PAGES[key]
    doc = (
        f"{summary}\n\nWhat it checks\n    {summary}\n\nWhy it breaks serving\n    Silent corruption.\n\n"
        "Example\n    ...\n\nUse instead\n    ...\n\nKnown false positives\n    None known."
    )
    return Check(key, name, kind, doc)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def fixed_check_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("flashcheck.catalogue.get_check", fake_get_check)


def _stack(*frames: tuple[str, int, str, str]) -> tuple[Frame, ...]:
    return tuple(Frame(f, ln, fn, code) for f, ln, fn, code in frames)


def current_findings() -> list[Finding]:
    return [
        Finding(
            id="FC102",
            name="host-sync-in-graph-capture",
            kind="static",
            severity=Severity.ERROR,
            confidence=Confidence.MEDIUM,
            message="`kv_lens.max().item()` synchronises the host inside `init_forward_metadata_capture_cuda_graph`, "
            "which runs under torch.cuda.graph capture",
            hint="compute the maximum on the host from the scheduler's seq_lens, or pass it in as an int",
            location=Location(
                file="engine/attention/flashinfer_backend.py",
                line=212,
                column=27,
                function="init_forward_metadata_capture_cuda_graph",
            ),
            evidence={"call": "Tensor.item", "capture_entry": "CudaGraphRunner.capture"},
            stack=_stack(
                ("engine/model_executor/cuda_graph_runner.py", 301, "capture", "self.capture_one_batch_size(bs)"),
                (
                    "engine/model_executor/cuda_graph_runner.py",
                    355,
                    "capture_one_batch_size",
                    "backend.init_forward_metadata_capture_cuda_graph(bs, ...)",
                ),
                (
                    "engine/attention/flashinfer_backend.py",
                    212,
                    "init_forward_metadata_capture_cuda_graph",
                    "max_kv = kv_lens.max().item()",
                ),
            ),
        ),
        Finding(
            id="FC203",
            name="persistent-buffer-reallocated",
            kind="runtime",
            message="kv_indices buffer captured by graph bs=16 (data_ptr 0x7f3a2c000000, 65536 int32) was replaced "
            "by a new tensor (0x7f3a30400000) before replay 41",
            hint="copy into the captured buffer in place (`buf[:n].copy_(new)`) instead of rebinding the attribute",
            location=Location(target=TARGET, step=41, step_name="replay bs=16", region="prepare_replay"),
            evidence={
                "buffer": "kv_indices",
                "bucket": 16,
                "captured_ptr": "0x7f3a2c000000",
                "replayed_ptr": "0x7f3a30400000",
                "numel": 65536,
            },
            stack=_stack(
                ("flashcheck/scenario.py", 188, "_replay", "target.prepare_replay(bucket, batch)"),
                (
                    "engine/attention/flashinfer_backend.py",
                    377,
                    "init_forward_metadata_replay_cuda_graph",
                    "self.kv_indices = torch.empty_like(kv_indices)",
                ),
            ),
        ),
        Finding(
            id="FC301",
            name="csr-well-formed",
            kind="property",
            message="kv_indptr[9]=34891 < kv_indptr[8]=36606 in the buffer replayed by graph bs=16",
            hint="rebuild the padded tail of kv_indptr on every replay: rows past the real batch repeat the last "
            "real value",
            location=Location(target=TARGET, step=57, step_name="replay bs=16", region="replay"),
            evidence={
                "check": "indptr-monotone",
                "index": 9,
                "value": 34891,
                "previous": 36606,
                "batch_size": 9,
                "padded": 16,
            },
        ),
        Finding(
            id="FC301",
            name="csr-well-formed",
            kind="property",
            severity=Severity.ERROR,
            message="kv_indices[1204]=9000 is outside the page pool (8192 pages)",
            hint="the indices of padded rows must point at a valid (dummy) page",
            location=Location(target=TARGET, step=88, step_name="replay bs=32", region="replay"),
            evidence={"check": "indices-in-range", "index": 1204, "value": 9000, "num_pages": 8192},
        ),
        Finding(
            id="FC304",
            name="workspace-within-bounds",
            kind="property",
            severity=Severity.WARNING,
            message="plan for bs=32, 61440 KV tokens needs 9.3 MiB of int workspace; 8.0 MiB were allocated",
            hint="size the int workspace for the largest bucket (or let FlashInfer grow it before capture)",
            location=Location(target=TARGET, step=103, step_name="plan bs=32", region="plan"),
            evidence={"workspace": "int_workspace", "needed": 9751756, "allocated": 8388608},
        ),
    ]


def baseline_findings() -> list[Finding]:
    cur = current_findings()
    gone = Finding(
        id="FC205",
        name="plan-outside-replay-window",
        kind="runtime",
        message="plan() on stream 7 is not ordered before replay on stream 0",
        hint="call plan() on the replay stream",
        location=Location(target=TARGET, step=12, step_name="plan bs=4", region="plan"),
        evidence={"plan_stream": 7, "replay_stream": 0},
    )
    return [cur[0], cur[2], gone]  # FC102 and one FC301 unchanged; FC205 fixed; the others new


def _samples(n: int = 140) -> list[Sample]:
    rng = random.Random(7)
    out: list[Sample] = []
    t = 0.0
    raised = {41: ("FC203",), 57: ("FC301",), 88: ("FC301",), 103: ("FC304",), 119: ("FC301",), 131: ("FC203",)}
    for step in range(n):
        t += rng.uniform(2.0, 9.0)
        bs = rng.choice([1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 16, 24, 31, 32])
        padded = next(b for b in (1, 2, 4, 8, 16, 32) if b >= bs)
        qo = bs * rng.choice([1, 1, 1, 4, 16])
        kv = sum(rng.randint(16, 2048) for _ in range(bs))
        int_used = 65536 + 96 * kv
        if step == 103:
            int_used = 9751756  # the FC304 step: more than the 8 MiB int workspace
        out.append(
            Sample(
                t=round(t, 3),
                step=step,
                op=rng.choice(["plan", "run", "replay"]),
                target=TARGET,
                batch_size=bs,
                padded=padded,
                total_qo=qo,
                total_kv=kv,
                workspaces={
                    "float_workspace": (4096 * qo + 1024 * kv // 4, 128 << 20),
                    "int_workspace": (int_used, 8 << 20),
                },
                findings=raised.get(step, ()),
            )
        )
    return out


def write_run(
    d: Path,
    findings: list[Finding],
    samples: list[Sample],
    *,
    errors: list[str] | None = None,
    seed: int = 1234,
    checks_by_target: dict[str, Any] | None = None,
) -> Path:
    """A run directory in the `rundir` format with fixed metadata (no live environment, no wall clock);
    `checks_by_target` None writes it as flashcheck did before runs recorded what they exercised."""
    (d / "repros").mkdir(parents=True, exist_ok=True)
    with_repro: list[Finding] = []
    for f in findings:
        if f.kind == "static":
            with_repro.append(f)
            continue
        sig = f.signature()
        repro = {
            "seed": seed,
            "target": TARGET,
            "step": f.location.step,
            "check": f.id,
            "batch": {"qo_lens": [1, 1, 4], "kv_lens": [5, 40, 17], "page_size": 16},
        }
        atomic_write_text(d / "repros" / f"{sig}.json", json.dumps(repro, indent=2, sort_keys=True) + "\n")
        with_repro.append(f.with_repro(f"repros/{sig}.json"))
    save_findings(d / "findings.json", with_repro)
    with (d / "samples.jsonl").open("w", encoding="utf-8") as fh:
        for s in samples:
            fh.write(json.dumps(s.to_dict(), sort_keys=True) + "\n")
    duration = max((s.t for s in samples), default=0.0) + 3.5
    meta = {
        "schema": 1,
        "tool": "flashcheck",
        "version": "0.1.0",
        "kind": "fuzz",
        "command": ["flashcheck", "fuzz", "--target", TARGET, "--seed", str(seed), "--steps", str(len(samples))],
        "seed": seed,
        "target": TARGET,
        "targets": [TARGET],
        "checks": ["FC203", "FC205", "FC301", "FC302", "FC304"],
        "started": STARTED,
        "finished": STARTED + round(duration, 3),
        "environment": ENVIRONMENT,
        "stats": {"steps": len(samples), "rejected_inputs": 3, "graphs_captured": 6, "replays": 57},
        "errors": errors
        if errors is not None
        else [
            "step 77 (run bs=31): CUDA error: an illegal memory access was encountered; the input is quarantined "
            "in repros/quarantine-77.json"
        ],
    }
    if checks_by_target is not None:
        meta["checks_by_target"] = checks_by_target
    atomic_write_text(d / "run.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return d


# what the synthetic run exercised: FC205 cannot apply here (its layer is skipped), the others ran
RECORD = {
    TARGET: {
        "exercised": ["FC203", "FC301", "FC302", "FC304"],
        "not_applicable": {"FC205": "no active detection layer sees it here (cupti: no CUDA device)"},
    }
}


@pytest.fixture
def make_run() -> Callable[..., Path]:
    """`write_run` for tests that build their own run directory."""
    return write_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "run", current_findings(), _samples(), checks_by_target=RECORD)


@pytest.fixture
def baseline_dir(tmp_path: Path) -> Path:
    return write_run(tmp_path / "baseline", baseline_findings(), _samples(60), errors=[], seed=99)


@pytest.fixture
def clean_run_dir(tmp_path: Path) -> Path:
    """A clean run as written before runs recorded what they exercised."""
    return write_run(tmp_path / "clean", [], _samples(30), errors=[], seed=5)


@pytest.fixture
def recorded_clean_run_dir(tmp_path: Path) -> Path:
    """A run without findings that exercised every selected check but FC304 (FC205 cannot apply here)."""
    record = {TARGET: {**RECORD[TARGET], "exercised": ["FC203", "FC301", "FC302"]}}
    return write_run(tmp_path / "recorded", [], _samples(30), errors=[], seed=5, checks_by_target=record)


@pytest.fixture
def no_color_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("TERM", raising=False)
    yield
