"""FC306 workspace-size-covers-config: the workspace sizes an engine configures cover the worst-case FlashInfer
plan of every batch its configuration admits (found by `flashcheck workspace`, `flashcheck.workspace`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flashcheck.check import Check
from flashcheck.findings import Confidence, Finding, Location, Severity

__all__ = ["WORKSPACE_SIZE_COVERS_CONFIG", "shortfall_finding"]

WORKSPACE_SIZE_COVERS_CONFIG = Check(
    "FC306",
    "workspace-size-covers-config",
    "property",
    doc="""\
    The float, int and pinned workspaces an engine configures cover every batch its configuration can plan.

    What it checks
        ``flashcheck workspace`` restates FlashInfer's planners (``PrefillPlan``, ``DecodePlan``,
        ``PrefillSM90Plan``, ``MLAPlan``, ``TwoStageHolisticPlan``: the split-KV decision, the padded batch
        size from the SM count, the CTA tile and every ``AlignedAllocator`` allocation) and computes, per wrapper
        use and workspace kind, an upper bound over all valid batches of the configuration (heads, page size,
        max batch, max tokens per step, graph buckets, speculative rows) and the batch a search finds that needs
        the most. A configured size below the bound is a finding; its evidence names the witness batch, the
        bytes it needs and whether the bound is exact, proven or searched.

    Why it breaks serving
        Engines size workspaces with constants (128, 256, 384, 512 MiB) or formulas that miss a factor: the
        split-KV partial outputs grow with query heads x padded CTAs x CTA tile x head dim, not with the batch's
        tokens. The first batch that needs more fails in ``plan()`` with ``Buffer overflow when allocating memory
        for batch_prefill_tmp_v`` and takes the engine down, typically long after deployment, when a rare shape
        (one long prompt with a short query chunk) arrives.

    Example
        ::

            $ flashcheck workspace --preset prefill-64h-16mib --flashinfer 0.7.2 --repro-dir w/
            FC306 workspace-size-covers-config [error]: configuration prefill-64h-16mib: float workspace of
              16.0 MiB (16,777,216 bytes) is below the 16.6 MiB (17,436,672 bytes) prefill-fa2 eager needs on
              FlashInfer 0.7 for the batch 1 x (qo 9, kv 4224)
            $ flashcheck replay w/witness-prefill-64h-16mib-float-0.7.json     # on a GPU: FC302, exit 1

        64 query heads over 8 KV heads, 9 new tokens (72 packed rows: the 128-row tile) and 4224 tokens of KV
        (33 chunks of 8 pages) fill all 2 x 132 / 8 = 33 split CTAs: the planner reserves 64 x 528 rows x 128 x 4
        bytes of partial outputs.

    Use instead
        Allocate the recommended size (the bound plus a margin) or derive the size from the planner's formulas
        for your configuration; on FlashInfer 0.7.2 check it per batch with ``wrapper.workspace_size(...)``. Give
        each wrapper planned concurrently its own int and pinned buffer.

    Known false positives
        A ``proven`` bound may exceed every batch the engine really builds when the engine's scheduler forbids
        shapes the configuration allows (for example a prompt chunk with a long prefix); the searched maximum
        beside it is a batch that does need the bytes. The CUDA-core decode bound assumes the occupancy limit of
        threads and shared memory; registers make the real grid smaller (give ``decode_blocks_per_sm``).
    """,
)


def shortfall_finding(
    *,
    kind: str,
    configured: int,
    need: Mapping[str, Any],
    config_name: str,
    repro: str | None = None,
) -> Finding:
    """The FC306 finding of a `kind` workspace of `configured` bytes below the oracle's `need` (a
    ``KindBound.to_dict()``): an error when the searched witness itself overflows, a warning when only the
    analytic bound does."""
    bound, searched = int(need["bound_bytes"]), int(need["searched_bytes"])
    witnessed = configured < searched
    mib = 1 << 20
    what = f"{kind} workspace of {configured / mib:.1f} MiB ({configured:,} bytes) is below the "
    if witnessed:
        what += f"{searched / mib:.1f} MiB ({searched:,} bytes) {need['use']} needs on FlashInfer "
        what += str(need["flashinfer_rules"])
        what += f" for the batch {need['witness_summary']}"
    else:
        what += f"{need['basis']} bound of {bound / mib:.1f} MiB ({bound:,} bytes) of {need['use']} on FlashInfer "
        what += f"{need['flashinfer_rules']} (the searched batches need at most {searched:,} bytes)"
    hint = (
        f"allocate at least {bound:,} bytes (the {need['basis']} bound; `flashcheck workspace` prints a "
        "recommended size with margin) or restrict the configuration (fewer tokens per step, fewer heads per GPU)"
    )
    if repro:
        hint += f"; `flashcheck replay {repro}` shows the overflow on a GPU"
    return WORKSPACE_SIZE_COVERS_CONFIG.finding(
        f"configuration {config_name}: {what}",
        severity=Severity.ERROR if witnessed else Severity.WARNING,
        confidence=Confidence.HIGH if witnessed else Confidence.MEDIUM,
        hint=hint,
        location=Location(region=f"{need['use']} ({kind} workspace)"),
        evidence={"check": f"{kind}-size", "workspace_kind": kind, "configured_bytes": configured, **dict(need)},
        repro=repro,
    )
