"""FC304 plan-info-stable: in CUDA-graph mode every re-plan yields the plan_info captured with the graph."""

from __future__ import annotations

from collections.abc import Sequence

from flashcheck.check import Check
from flashcheck.findings import Finding, Location
from flashcheck.properties.phases import BeforeReplay, Phase, Property

__all__ = ["PLAN_INFO_STABLE", "check_plan_info"]

PLAN_INFO_STABLE = Check(
    "FC304",
    "plan-info-stable",
    "property",
    doc="""\
    A re-plan before replay yields exactly the plan_info the graph was captured with.

    What it checks
        After each re-plan of a graph-mode wrapper (full ``plan()`` or ``fast_decode_plan``), the wrapper's
        plan_info, normalized with ``[int(x) for x in wrapper._plan_info]`` (read for checking only), equals the
        one recorded at capture. Evidence lists the first differing entry.

    Why it breaks serving
        A captured graph bakes in the grid size (``padded_batch_size``), the split-KV switch, ``cta_tile_q`` and every
        workspace offset; only device buffers are re-read at replay. If a re-plan picks another schedule, the graph
        launches the old grid over new offsets: requests are skipped or read another request's partial results.
        FA2/FA3 keep it stable by design; MLA's ``num_blks_x`` depends on the average query length.

    Example
        An MLA graph captured for decode and replayed for speculative verify (q_len 4): ``plan_info[0]`` flips
        from 1 to 2 clusters.

    Use instead
        Capture one graph per schedule-determining shape (q_len per request), keep ``fixed_split_size`` /
        ``disable_split_kv`` identical between capture and replay, and re-capture when the schedule must change.

    Known false positives
        Wrappers that expose no plan_info (trtllm-gen, cudnn) are not checked.
    """,
)


def check_plan_info(
    captured: Sequence[int], current: Sequence[int], *, bucket: int, location: Location | None = None
) -> list[Finding]:
    """One FC304 finding when `current` differs from `captured`."""
    cap, cur = [int(x) for x in captured], [int(x) for x in current]
    if cap == cur:
        return []
    i = next((k for k, (a, b) in enumerate(zip(cap, cur, strict=False)) if a != b), min(len(cap), len(cur)))
    a = cap[i] if i < len(cap) else None
    b = cur[i] if i < len(cur) else None
    return [
        PLAN_INFO_STABLE.finding(
            f"graph bs={bucket}: plan_info[{i}] is {b} after re-plan, {a} at capture",
            hint="the captured graph keeps the old grid and offsets; re-capture or keep the schedule fixed",
            location=location,
            evidence={"check": "plan-info", "bucket": bucket, "index": i, "captured": cap, "current": cur},
        )
    ]


def _before_replay(obs: BeforeReplay) -> list[Finding]:
    if obs.captured_plan_info is None or obs.plan_info is None:
        return []
    return check_plan_info(obs.captured_plan_info, obs.plan_info, bucket=obs.bucket, location=obs.location)


BEFORE_REPLAY = Property(PLAN_INFO_STABLE, Phase.BEFORE_REPLAY, _before_replay)
