"""Faulty variants of the built-in FlashInfer targets for the verdict families: kernel faults and divergences from
stale plans and unbound buffers, graph wrappers built or re-planned wrong (backend errors on valid input, hangs),
host syncs on the eager path, an output-contract violation, and a pinned mirror rewritten while its copy is in
flight (GPU only).

Each class names the engine bug it re-creates, the checks that may report it (`accepted`), and marks the offending
line with ``# BUG``. Importable by name (``faulty_engine_gpu:Class``) for worker processes; torch and FlashInfer are
imported only inside methods, as in the built-in targets. `benchmarks/verdicts.py` and
`tests/gpu/test_faulty_engine_gpu.py` drive them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.base import GraphSlot
from flashcheck.targets.flashinfer.decode import DecodeTarget
from flashcheck.targets.flashinfer.prefill import PagedPrefillTarget
from flashcheck.targets.protocol import TargetEnv

STALE_PLAN = ("FC250", "FC303", "FC252")


class _Named:
    """Mixin: each faulty target reports under its own name (not the built-in it derives from)."""

    target_name: ClassVar[str] = ""
    name: str

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.name = self.target_name


class _NoReplan:
    """Mixin: the replay preparation writes the persistent buffers but never re-plans the graph wrapper."""

    slots: dict[int, GraphSlot]

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        slot = self.slots[bucket]
        self.fill_metadata(layout)  # type: ignore[attr-defined]
        # BUG: no re-plan: the graph keeps the work partition and split-KV offsets planned at capture
        slot.real_batch, slot.real_rows = layout.batch_size, layout.real_qo_rows()


class NoReplanDecodeTC(_Named, _NoReplan, DecodeTarget):
    """A graph runner that skips ``plan``/``fast_decode_plan`` before replay (tensor-core decode)."""

    target_name = "no-replan-decode-tc"

    accepted: ClassVar[tuple[str, ...]] = STALE_PLAN

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)


class NoReplanDecodeCuda(_Named, _NoReplan, DecodeTarget):
    """The same on CUDA-core decode."""

    target_name = "no-replan-decode-cuda"

    accepted: ClassVar[tuple[str, ...]] = STALE_PLAN


class NoReplanPrefillGraph(_Named, _NoReplan, PagedPrefillTarget):
    """The same on paged-prefill graphs (SGLang target-verify): the plan of the capture's fixed row count stays."""

    target_name = "no-replan-prefill-graph"

    accepted: ClassVar[tuple[str, ...]] = STALE_PLAN

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("buckets", (1, 2, 4, 8, 16))
        kw.setdefault("max_qo_len", 16)
        super().__init__(**kw)


class IndicesToUnboundBuffer(_Named, DecodeTarget):
    """The replay preparation writes this step's page indices into a scratch buffer and hands that one to
    ``fast_decode_plan``, which rebinds the wrapper's attribute without copying: the captured graph still reads the
    buffer bound at capture, with the previous batch's pages."""

    target_name = "indices-to-unbound-buffer"

    accepted: ClassVar[tuple[str, ...]] = ("FC303", "FC301", "FC250")

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def setup(self, env: TargetEnv) -> None:
        super().setup(env)
        self._scratch = self.torch.zeros_like(self.kv_indices_gpu)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        slot, bound = self.slots[bucket], self.kv_indices_gpu
        self.kv_indices_gpu = self._scratch  # BUG: not the buffer the graph was captured with
        try:
            tot = self.fill_metadata(layout)
            self._replan(slot, layout, tot)
        finally:
            self.kv_indices_gpu = bound
        slot.real_batch, slot.real_rows = layout.batch_size, layout.real_qo_rows()


class GraphWithoutCudaGraphWrapper(_Named, DecodeTarget):
    """The bucket's wrapper is built without ``use_cuda_graph=True`` (and without persistent buffers), captured,
    then re-planned before every replay: each plan allocates new metadata buffers, and the graph reads the old ones."""

    target_name = "graph-without-cuda-graph-wrapper"

    accepted: ClassVar[tuple[str, ...]] = ("FC303", "FC250", "FC252", "FC304", "FC202")

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        kw.setdefault("replan", "full")
        super().__init__(**kw)

    def _make_graph_wrapper(self, bucket: int) -> Any:
        # BUG: no use_cuda_graph=True, no paged_kv_*_buffer: plan() moves the buffers the graph reads
        return self.fi.mod.BatchDecodeWithPagedKVCacheWrapper(
            self._float_ws_for(f"graph bs={bucket}"), "NHD", use_tensor_cores=self.use_tensor_cores
        )


class ReplanWithRealBatch(_Named, DecodeTarget):
    """Before replay the graph wrapper is re-planned with the real batch instead of the bucket's padded batch;
    FlashInfer raises "The batch size should be fixed in cudagraph mode" (valid input: a finding)."""

    target_name = "replan-with-real-batch"

    accepted: ClassVar[tuple[str, ...]] = ("FC250",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        kw.setdefault("replan", "full")
        super().__init__(**kw)

    def _replan(self, slot: GraphSlot, layout: PagedLayout, tot: int) -> None:
        t, n = self.capacity.template, layout.batch_size  # BUG: layout.padded_batch_size is what the graph has
        slot.wrapper.plan(
            self.kv_indptr_cpu[: n + 1],
            self.kv_indices_gpu[: int(layout.kv_indptr[n])],
            self.last_cpu[:n],
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim_qk,
            t.page_size,
            pos_encoding_mode="NONE",
            **self._common_kw(),
        )


class IndicesBufferTooSmall(_Named, DecodeTarget):
    """The graph wrappers' page-index buffer is sized by a formula (four pages per request) that a batch within the
    target's capacity outgrows: FlashInfer raises "The size of indices should be less than or equal to the
    allocated buffer" (valid input: a finding)."""

    target_name = "indices-buffer-too-small"

    accepted: ClassVar[tuple[str, ...]] = ("FC250",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def _make_graph_wrapper(self, bucket: int) -> Any:
        pages = 4 * self.capacity.max_batch_size  # BUG: max_kv_len allows 256 pages per request
        return self.fi.mod.BatchDecodeWithPagedKVCacheWrapper(
            self._float_ws_for(f"graph bs={bucket}"),
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=self.kv_indptr_gpu[: bucket + 1],
            paged_kv_indices_buffer=self.kv_indices_gpu[:pages],
            paged_kv_last_page_len_buffer=self.last_gpu[:bucket],
        )


class EagerCpuSync(_Named, DecodeTarget):
    """The eager metadata build reads the sequence lengths back from the device every step (``seq_lens.cpu()``)."""

    target_name = "eager-cpu-sync"

    accepted: ClassVar[tuple[str, ...]] = ("FC201",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def plan(self, layout: PagedLayout) -> None:
        tot = self.fill_metadata(layout)
        seq_lens = self.kv_len_gpu[: layout.padded_batch_size]
        self._max_seq_len = int(seq_lens.cpu().max())  # BUG: a device-to-host copy on every eager step
        self._eager_rows = layout.real_qo_rows()
        self._plan(self.eager, layout, tot, graph=False)


class EagerScalarSync(_Named, DecodeTarget):
    """The eager forward turns a device scale into a Python float (``float(device_scale)``) every step."""

    target_name = "eager-scalar-sync"

    accepted: ClassVar[tuple[str, ...]] = ("FC201",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def setup(self, env: TargetEnv) -> None:
        super().setup(env)
        self._device_scale = self.torch.ones((), dtype=self.torch.float32, device=env.device)

    def run(self, q: Any) -> Any:
        scale = float(self._device_scale)  # BUG: .item() on a device tensor in the per-step forward
        out = super().run(q)
        return out if scale == 1.0 else out * scale


class ExtraPaddedRow(_Named, DecodeTarget):
    """The graph runner slices the static output with one padded row too many."""

    target_name = "extra-padded-row"

    accepted: ClassVar[tuple[str, ...]] = ("FC305",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def replay(self, bucket: int, q: Any) -> Any:
        slot = self.slots[bucket]
        slot.static_q[: q.shape[0]].copy_(q)
        slot.graph.replay()
        return slot.static_out[: slot.real_rows + 1]  # BUG: one padded row too many (when the batch was padded)


class KernelNeverEnds(_Named, DecodeTarget):
    """A captured forward whose kernel never finishes for padded batches (a loop bound read from a stale buffer, a
    wait on a flag no block sets), stood in for by a device-side spin: the replay never completes, the host blocks
    in its next synchronize where Python cannot interrupt it, and only a worker's watchdog ends it (FC252)."""

    target_name = "kernel-never-ends"
    accepted: ClassVar[tuple[str, ...]] = ("FC252",)

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def replay(self, bucket: int, q: Any) -> Any:
        out = super().replay(bucket, q)
        if q.shape[0] < bucket:
            self.torch.cuda._sleep(1 << 50)  # BUG: stands for a kernel that spins forever on padded rows
        return out


class PinnedMirrorRewrittenInFlight(_Named, DecodeTarget):
    """An overlapped scheduler: right after enqueuing this step's ``non_blocking`` copies of the pinned metadata
    mirrors and re-planning, the host writes the next batch's ``last_page_len`` into the same pinned mirror. The copy
    reads whatever the mirror holds when the stream reaches it: on an idle GPU usually this step's values, with the
    stream busy the next step's (mini-sglang's overlap-scheduling crash, vLLM's reused pinned metadata buffers).
    The staging layer reports the write on every replay whose copy is still in flight (FC204; its stream hold makes
    that most replays); with async pressure the graph also reads the wrong lengths (FC303)."""

    target_name = "pinned-mirror-rewritten-in-flight"
    accepted: ClassVar[tuple[str, ...]] = ("FC204", "FC303")

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("use_tensor_cores", True)
        super().__init__(**kw)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        super().prepare_replay(bucket, layout)
        full = self.capacity.template.page_size
        self.last_cpu[: layout.batch_size].fill_(full)  # BUG: next batch's mirror written while the copy is in flight


# Races: found by the staging layer (layers="races") on the replays whose copy is in flight, by FC303 only when the
# stream is busy (async pressure); not in FAULTY_ENGINE_TARGETS, whose test runs the cheap layers without pressure.
RACE_TARGETS: dict[str, tuple[type, tuple[str, ...]]] = {
    "pinned-mirror-rewritten-in-flight": (PinnedMirrorRewrittenInFlight, PinnedMirrorRewrittenInFlight.accepted),
}


FAULTY_ENGINE_TARGETS: dict[str, tuple[type, tuple[str, ...]]] = {
    "no-replan-decode-tc": (NoReplanDecodeTC, NoReplanDecodeTC.accepted),
    "no-replan-decode-cuda": (NoReplanDecodeCuda, NoReplanDecodeCuda.accepted),
    "no-replan-prefill-graph": (NoReplanPrefillGraph, NoReplanPrefillGraph.accepted),
    "indices-to-unbound-buffer": (IndicesToUnboundBuffer, IndicesToUnboundBuffer.accepted),
    "graph-without-cuda-graph-wrapper": (GraphWithoutCudaGraphWrapper, GraphWithoutCudaGraphWrapper.accepted),
    "replan-with-real-batch": (ReplanWithRealBatch, ReplanWithRealBatch.accepted),
    "indices-buffer-too-small": (IndicesBufferTooSmall, IndicesBufferTooSmall.accepted),
    "eager-cpu-sync": (EagerCpuSync, EagerCpuSync.accepted),
    "eager-scalar-sync": (EagerScalarSync, EagerScalarSync.accepted),
    "extra-padded-row": (ExtraPaddedRow, ExtraPaddedRow.accepted),
    "kernel-never-ends": (KernelNeverEnds, KernelNeverEnds.accepted),
}
