"""The target protocol: how flashcheck drives an attention backend through plan, run, capture and replay.

A target is the code under test: a built-in FlashInfer harness that drives the wrappers the way vLLM/SGLang do,
the CPU reference target, or a user's own backend wrapped in about 50 lines (see docs/targets.md). The driver
(`flashcheck.scenario`) owns the KV cache, the queries, the regions and every check; the target only does what
the engine does.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument, InvalidDefinition
from flashcheck.layout import PaddingPolicy, PagedLayout
from flashcheck.properties.csr import CsrInput
from flashcheck.runtime.api import ArenaLike

__all__ = ["Capacity", "Target", "TargetEnv", "check_target"]


@dataclass(frozen=True)
class Capacity:
    """Shapes a target supports; the driver only generates batches inside these.

    Attributes:
        template: heads, dims, dtypes, page size, causal/window/soft cap of every batch (lengths are replaced).
        max_batch_size: most requests in one batch (also the largest graph bucket).
        max_pages: size of the KV page pool the driver allocates.
        max_qo_len: longest query per request (1 for decode-only targets).
        max_kv_len: longest KV per request.
        max_total_qo: most query rows in one batch (graph-mode prefill fixes this at first plan).
        buckets: CUDA-graph batch-size buckets, ascending; empty for eager-only targets.
        padding: how the target pads a batch to its bucket.
        paged: False for ragged (non-paged) targets.
        value_from_key: V is the first ``head_dim_vo`` columns of K (MLA's ckv), not a separate cache.
    """

    template: BatchSpec
    max_batch_size: int
    max_pages: int
    max_qo_len: int = 1
    max_kv_len: int = 4096
    max_total_qo: int = 1 << 30
    buckets: tuple[int, ...] = ()
    padding: PaddingPolicy = PaddingPolicy.NONE
    paged: bool = True
    value_from_key: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "padding", PaddingPolicy.parse(self.padding))
        if list(self.buckets) != sorted(set(self.buckets)):
            raise InvalidArgument(f"Capacity.buckets must be ascending and distinct, got {list(self.buckets)}")

    def bucket_for(self, batch_size: int) -> int | None:
        """Smallest bucket >= batch_size, or None (run eagerly)."""
        return next((b for b in self.buckets if b >= batch_size), None)


@dataclass
class TargetEnv:
    """What the driver hands a target at setup.

    Attributes:
        device: ``"cuda"`` or ``"cpu"``.
        arena: where workspaces come from (guard zones, high-water marks).
        k_cache, v_cache: the paged KV cache, [max_pages, page_size, num_kv_heads, head_dim] (NHD), KV dtype.
            For MLA targets: ckv [max_pages, page_size, 512] and kpe [max_pages, page_size, 64].
        extra: target-specific objects the driver passes through (e.g. a pre-built shared workspace).
    """

    device: str
    arena: ArenaLike
    k_cache: Any
    v_cache: Any
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Target(Protocol):
    """The code under test.

    Every method is called by the driver inside the matching region; the driver passes *real* rows only (the
    target pads to its bucket itself, as an engine does) and compares the real rows of what comes back.

    Two optional members, read with ``getattr``: ``accepts(spec: BatchSpec) -> str | None``, an explicit input
    contract (a reason rejects the step, the only way a step is skipped), and ``cold_regions``, the per-step regions
    this engine runs only once (nothing inside them is checked for host syncs).
    """

    name: str
    capacity: Capacity

    def config(self) -> Mapping[str, Any]:
        """JSON-able configuration, enough to rebuild the target for a reproducer."""
        ...

    def setup(self, env: TargetEnv) -> None:
        """Allocate persistent buffers and workspaces (from ``env.arena``) and build wrappers."""
        ...

    def plan(self, layout: PagedLayout) -> None:
        """Eager path: build metadata for `layout` (unpadded) and plan a non-graph wrapper."""
        ...

    def run(self, q: Any) -> Any:
        """Eager path: attention of `q` [total_qo, H, Dqk] under the last plan -> [total_qo, H, Dvo]."""
        ...

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        """Graph path: plan the bucket's graph-mode wrapper for `layout` (padded to `bucket`), warm up, capture."""
        ...

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        """Graph path, outside the graph: write the persistent metadata buffers and re-plan for `layout`."""
        ...

    def replay(self, bucket: int, q: Any) -> Any:
        """Graph path: copy `q` (real rows) into the static input, replay, return the real output rows."""
        ...

    def graph_metadata(self, bucket: int) -> CsrInput | None:
        """The persistent buffers the captured graph reads (checked just before each replay), or None."""
        ...

    def plan_info(self, bucket: int) -> list[int] | None:
        """The bucket's wrapper plan_info normalized to ints (graph-shape invariant), or None if not exposed."""
        ...

    def teardown(self) -> None:
        """Release graphs and buffers."""
        ...


_REQUIRED = (
    "config",
    "setup",
    "plan",
    "run",
    "capture",
    "prepare_replay",
    "replay",
    "graph_metadata",
    "plan_info",
    "teardown",
)


def check_target(obj: object) -> Target:
    """Validate that `obj` implements the protocol; raise `InvalidDefinition` naming what is missing."""
    missing = [m for m in _REQUIRED if not callable(getattr(obj, m, None))]
    for attr, typ in (("name", str), ("capacity", Capacity)):
        if not isinstance(getattr(obj, attr, None), typ):
            missing.append(f"{attr} ({typ.__name__})")
    if missing:
        raise InvalidDefinition(
            f"{type(obj).__name__} is not a flashcheck target: missing {', '.join(missing)}; "
            "see docs/targets.md for the protocol"
        )
    for m, n in (("plan", 1), ("run", 1), ("capture", 3), ("prepare_replay", 2), ("replay", 2)):
        params = [
            p
            for p in inspect.signature(getattr(obj, m)).parameters.values()
            if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) != n:
            raise InvalidDefinition(
                f"{type(obj).__name__}.{m} takes {len(params)} required argument(s), the protocol passes {n}"
            )
    return obj  # type: ignore[return-value]
