"""CPU analogs of the seed bugs on the reference target, so CI proves each property fires (never a GPU claim)."""

from __future__ import annotations

from typing import Any

from flashcheck.layout import PagedLayout
from flashcheck.targets.reference import ReferenceTarget


class StaleLastPageLen(ReferenceTarget):
    """Replay preparation forgets to refresh last_page_len: the graph buffers disagree with the batch; the CSR check
    of the persistent buffers before replay sees rows outside the padding policy or page range (FC301)."""

    intended = "FC301"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        keep = self.bufs[bucket]["kv_last_page_len"].clone()
        super().prepare_replay(bucket, layout)
        self.bufs[bucket]["kv_last_page_len"].copy_(keep)  # BUG: stale values


class QueryFrozenAtCapture(ReferenceTarget):
    """The replay path keeps the static query of the last capture instead of copying the new one: valid metadata,
    wrong numbers (FC303)."""

    intended = "FC303"

    def replay(self, bucket: int, q: Any) -> Any:
        g, b = self._graphs[bucket], self.bufs[bucket]
        # BUG: q is not copied into self.static_q
        out = self._attend(
            self.static_q, b["qo_indptr"], b["kv_indptr"], self.kv_indices, b["kv_last_page_len"], bucket
        )
        return out[: g.real_rows]


class IndptrPollutedInGraph(ReferenceTarget):
    """CPU analog: the 'graph' rewrites the shared kv_indptr; preparation refreshes only the real rows (FC301)."""

    intended = "FC301"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        old = self.bufs[bucket]["kv_indptr"].clone()
        super().prepare_replay(bucket, layout)
        n = layout.batch_size
        self.bufs[bucket]["kv_indptr"][n + 1 :] = old[n + 1 :]  # BUG: padded tail not rewritten

    def after_replay(self, bucket: int) -> None:
        self.bufs[bucket]["kv_indptr"][1:] = self.torch.arange(1, bucket + 1, dtype=self.torch.int32)  # BUG


class UndersizedWorkspace(ReferenceTarget):
    """CPU analog: the split-KV partial workspace is sized for the batch's requests, not its rows, so
    multi-token requests write partials past its end (FC302, seen in the arena's guard zone)."""

    intended = "FC302"

    def workspace_rows(self) -> int:
        return max(self.capacity.buckets)  # BUG: one row per request


class UnstablePlanInfo(ReferenceTarget):
    """The re-plan picks a schedule that depends on the real batch size (FC304)."""

    intended = "FC304"

    def plan_info(self, bucket: int) -> list[int] | None:
        g = self._graphs.get(bucket)
        return [bucket, self.chunk, g.real_batch if g else 0]  # BUG: schedule follows the batch


CPU_SEED_BUGS: dict[str, Any] = {
    "stale-last-page-len": StaleLastPageLen,
    "query-frozen-at-capture": QueryFrozenAtCapture,
    "indptr-polluted-in-graph": IndptrPollutedInGraph,
    "undersized-workspace": UndersizedWorkspace,
    "unstable-plan-info": UnstablePlanInfo,
}
