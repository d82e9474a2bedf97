"""Faulty variants of the built-in FlashInfer targets that re-create five real engine bugs (GPU only).

Each class names the bug, the property that must flag it, and the offending line (marked ``# SEED BUG``). They live
in the test suite, apart from the real targets; `benchmarks/seed_bugs.py` and `tests/gpu/test_seed_bugs_gpu.py`
drive them.
"""

from __future__ import annotations

from typing import Any

from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.decode import DecodeTarget
from flashcheck.targets.flashinfer.prefill import PagedPrefillTarget


class TolistInPrepareReplay(DecodeTarget):
    """rtp-llm PR 1099: replay preparation reads a CUDA tensor back to estimate the workspace.

    Intended property: FC201 host-sync-in-replay, stack pointing at the ``.tolist()`` line.
    """

    intended = "FC201"

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        qo = self.kv_indptr_gpu[: bucket + 1].detach().to("cpu").tolist()  # SEED BUG: D2H before every replay
        self._estimated_pages = qo[-1]


class DeviceIndptrToPlan(DecodeTarget):
    """A vLLM #20466 review: device indptr/last_page_len passed to plan() on every step.

    FlashInfer copies them to the host inside plan() (a blocking D2H). Intended property: FC201.
    """

    intended = "FC201"

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("metadata", "device")  # SEED BUG: plan() gets device metadata
        kw.setdefault("replan", "full")
        super().__init__(**kw)


class IndptrPollutedInGraph(DecodeTarget):
    """An SGLang fork: a persistent kv_indptr buffer shared with the graph-mode wrapper is overwritten by
    the captured forward; replay preparation rewrites only the real rows ("padding was filled at capture").

    Intended property: FC301 csr-well-formed at replay (the padded tail goes backwards).
    """

    intended = "FC301"

    def setup(self, env: Any) -> None:
        super().setup(env)
        self.sparse_counts = self.torch.ones(self.capacity.max_batch_size, dtype=self.torch.int32, device=env.device)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        slot = self.slots[bucket]
        t = self.torch
        n = layout.batch_size
        tot = int(layout.kv_indptr[-1])
        self.kv_indptr_cpu[: n + 1].copy_(t.from_numpy(layout.kv_indptr[: n + 1]))
        self.last_cpu[:bucket].copy_(t.from_numpy(layout.kv_last_page_len))
        self.indices_staging[:tot].copy_(t.from_numpy(layout.kv_indices[:tot]))
        self.kv_indices_gpu[:tot].copy_(self.indices_staging[:tot], non_blocking=True)
        self.kv_indptr_gpu[: n + 1].copy_(
            self.kv_indptr_cpu[: n + 1], non_blocking=True
        )  # SEED BUG: tail not rewritten
        self.last_gpu[:bucket].copy_(self.last_cpu[:bucket], non_blocking=True)
        self.kv_indptr_cpu[n + 1 : bucket + 1].copy_(t.from_numpy(layout.kv_indptr[n + 1 : bucket + 1]))
        self._replan(slot, layout, tot)
        slot.real_batch, slot.real_rows = layout.batch_size, layout.real_qo_rows()

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        o = super()._run(wrapper, q, out)
        # only the captured forward rewrites the buffer (as in the seed); polluting during the eager warm-up made the
        # second warm-up's kernel read an indptr its plan never saw and hang the H100 (reports/gpu-evidence.md)
        if wrapper is not self.eager and self.torch.cuda.is_current_stream_capturing():
            b = q.shape[0]
            # the captured forward recomputes the sparse indptr in place (minicpm_backend): SEED BUG
            self.kv_indptr_gpu[1 : b + 1].copy_(self.torch.cumsum(self.sparse_counts[:b], 0))
        return o


class UndersizedPrefillWorkspace(PagedPrefillTarget):
    """The float workspace is sized by a hand formula (one CTA tile of rows per request) that is too
    small for graph-mode split-KV, whose ``tmp_v`` FlashInfer sizes for the padded batch.

    Intended property: FC302 workspace-within-bounds (FlashInfer's planner reports the overflow).
    """

    intended = "FC302"

    def __init__(self, **kw: Any) -> None:
        t = kw.get("template")
        heads, dim = (t.num_qo_heads, t.head_dim_vo) if t is not None else (32, 128)
        buckets = kw.setdefault("buckets", (1, 2, 4, 8, 16))
        kw.setdefault("max_qo_len", 16)
        # SEED BUG: rows * heads * dim * 4 bytes "is enough" (ignores split chunks and the padded CTA count)
        kw["workspace_bytes"] = max(buckets) * 16 * heads * dim * 4
        super().__init__(**kw)


class ReallocOnReplay(PagedPrefillTarget):
    """rtp-llm PR 1099 (forbid_realloc): when the estimate grows, the workspace is re-allocated on the replay path.

    Intended property: FC202 allocation-in-replay (and the captured graph still points at the old buffer).
    """

    intended = "FC202"

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("buckets", (1, 2, 4, 8, 16))
        kw.setdefault("max_qo_len", 16)
        super().__init__(**kw)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        need = int(layout.kv_indptr[-1]) * 4096
        if need > getattr(self, "_ws_estimate", 0):
            self._ws_estimate = need
            self._spare = self.torch.empty(need, dtype=self.torch.uint8, device=self.env.device)  # SEED BUG
        super().prepare_replay(bucket, layout)


class SplitKVOversubscribed(DecodeTarget):
    """FlashInfer #3379: the split-KV partial buffer is sized for one CTA per SM, but mixed sequence
    lengths launch more CTAs; a small kernel (torch ops on a strided view, as a CUDA kernel addresses memory)
    writes every CTA's partial result into the workspace, past its end.

    Intended property: FC302 workspace-within-bounds (the arena's guard zone is written).
    """

    intended = "FC302"
    CHUNK = 512  # KV tokens per CTA
    PARTIAL = 64  # bytes of partial (o, lse) per CTA: the overflow stays inside the arena guard zone

    def setup(self, env: Any) -> None:
        super().setup(env)
        sms = self.torch.cuda.get_device_properties(0).multi_processor_count
        self.partials = env.arena.workspace(
            "splitkv_partials",
            sms * self.PARTIAL,
            device=env.device,  # SEED BUG
            kind="engine",
            zero=False,
        )

    def plan(self, layout: PagedLayout) -> None:
        super().plan(layout)
        kv = layout.seq_lens[: layout.batch_size]
        self._ctas = int(sum(-(-int(k) // self.CHUNK) for k in kv))

    def run(self, q: Any) -> Any:
        out = super().run(q)
        t = self.torch
        base = self.partials
        f = t.empty(0, dtype=t.uint8, device=base.device).set_(base.untyped_storage())
        view = f.as_strided((self._ctas * self.PARTIAL,), (1,), base.storage_offset())
        view.fill_(7)  # every launched CTA writes its partial
        return out


SEED_BUG_TARGETS: dict[str, type] = {
    "seed000-tolist-in-prepare-replay": TolistInPrepareReplay,
    "seed000-realloc-on-replay": ReallocOnReplay,
    "seed000-004-undersized-workspace": UndersizedPrefillWorkspace,
    "seed001-splitkv-oversubscribed": SplitKVOversubscribed,
    "seed002-device-indptr-to-plan": DeviceIndptrToPlan,
    "seed003-indptr-polluted-in-graph": IndptrPollutedInGraph,
}
