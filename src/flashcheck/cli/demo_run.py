"""The run behind ``flashcheck demo``: generated batches through the layout builder, CSR property and CPU reference.

Runs anywhere (no GPU). Each step draws a batch from a named distribution, builds its paged layout under a
random allocator and padding policy, checks FC301, and compares the paged reference output with the ragged one.
With ``--plant`` (default) one step re-creates a real engine bug (a persistent kv_indptr polluted between replays,
from an SGLang fork) so the output shows what a finding looks like.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.findings import Finding, Location
from flashcheck.fuzzing.distributions import DISTRIBUTIONS, sample_lengths
from flashcheck.layout import PaddingPolicy, PagedLayout, build_paged_layout, build_ragged_layout
from flashcheck.properties.csr import CsrInput, check_csr, check_layout
from flashcheck.reference import gather_paged_kv, paged_attention, ragged_attention


def run(args: argparse.Namespace) -> int:
    """The demo run of `flashcheck demo` (see `flashcheck.cli.demo` for its flags)."""
    if args.steps < 1:
        raise InvalidArgument(f"--steps must be >= 1, got {args.steps}")
    rng = np.random.default_rng(args.seed)
    print(f"flashcheck demo: {args.steps} steps, seed={args.seed}, target=cpu-reference")
    findings: list[Finding] = []
    t0 = time.perf_counter()
    max_abs = 0.0
    plant_at = args.steps // 2 if args.plant else -1
    for step in range(args.steps):
        dist = str(rng.choice(DISTRIBUTIONS))
        bs = int(rng.integers(1, 9))
        page = int(rng.choice([1, 16, 32]))
        qo, kv = sample_lengths(dist, bs, int(rng.integers(1 << 31)), max_kv=256, page_size=page)
        heads_kv = int(rng.choice([1, 2]))
        spec = BatchSpec(
            tuple(int(x) for x in qo),
            tuple(int(x) for x in kv),
            page_size=page,
            num_qo_heads=heads_kv * int(rng.choice([1, 4])),
            num_kv_heads=heads_kv,
            head_dim_qk=32,
            head_dim_vo=32,
            causal=bool(rng.integers(2)),
            window_left=int(rng.choice([-1, -1, 7])),
            logits_soft_cap=float(rng.choice([0.0, 0.0, 30.0])),
        )
        policies = [PaddingPolicy.SGLANG] if page == 1 else [PaddingPolicy.VLLM_LEGACY, PaddingPolicy.VLLM_CURRENT]
        policy = policies[int(rng.integers(len(policies)))]
        layout = build_paged_layout(
            spec,
            pad_to=bs + int(rng.integers(0, 4)),
            padding=policy,
            allocator=str(rng.choice(["contiguous", "shuffled", "fragmented"])),
            seed=step,
        )
        where = Location(target="cpu-reference", step=step, step_name=f"plan {dist} bs={bs}")
        step_findings = check_layout(layout, location=where)
        if step == plant_at:
            step_findings += _planted(layout, where)
        findings += step_findings
        # numerical cross-check: the paged path and the ragged path of the reference must agree
        q = rng.standard_normal((layout.total_qo_rows, spec.num_qo_heads, 32)).astype(np.float32)
        k_cache = rng.standard_normal((layout.num_pages, page, heads_kv, 32)).astype(np.float32)
        v_cache = rng.standard_normal((layout.num_pages, page, heads_kv, 32)).astype(np.float32)
        paged = paged_attention(q, k_cache, v_cache, layout)
        k_rows, v_rows = _dense(k_cache, layout), _dense(v_cache, layout)
        ragged = ragged_attention(q[: layout.real_qo_rows()], k_rows, v_rows, build_ragged_layout(spec))
        max_abs = max(max_abs, float(np.abs(paged[: layout.real_qo_rows()] - ragged).max(initial=0.0)))
    for f in findings:
        print(f)
    dt = time.perf_counter() - t0
    print(
        f"summary: {args.steps} steps in {dt:.2f}s, {len(findings)} finding(s)"
        f"{' (1 planted step)' if args.plant else ''}, paged-vs-ragged reference max |diff| = {max_abs:.2e}"
    )
    expected_planted = 1 if args.plant else 0
    return 0 if len({f.location.step for f in findings}) == expected_planted and max_abs < 1e-4 else 1


def _planted(layout: PagedLayout, where: Location) -> list[Finding]:
    """The graph rewrote the shared kv_indptr buffer (an SGLang fork); the next replay plans on it."""
    polluted = layout.kv_indptr.copy()
    polluted[1] = polluted[-1] + 3
    return check_csr(
        CsrInput(
            polluted,
            layout.kv_indices,
            layout.kv_last_page_len,
            layout.num_pages,
            layout.page_size,
            batch_size=layout.batch_size,
            padding=layout.padding,
        ),
        location=Location(
            target=where.target,
            step=where.step,
            step_name="planted seed-003: persistent kv_indptr rewritten inside the graph",
        ),
        prefix="[planted] ",
    )


def _dense(cache: npt.NDArray[np.float32], layout: PagedLayout) -> npt.NDArray[np.float32]:
    parts = [
        gather_paged_kv(
            cache,
            layout.kv_indices,
            slice(int(layout.kv_indptr[i]), int(layout.kv_indptr[i + 1])),
            int(layout.kv_last_page_len[i]),
            layout.page_size,
        )
        for i in range(layout.batch_size)
    ]
    return np.concatenate(parts)
