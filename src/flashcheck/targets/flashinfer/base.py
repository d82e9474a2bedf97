"""Engine-shaped plumbing shared by the FlashInfer targets: workspaces, persistent metadata buffers with pinned
host mirrors (vLLM's recipe), per-bucket graph capture on a side stream, static inputs/outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from flashcheck._cuda_graphs import capture_graph
from flashcheck.batch import BatchSpec, DType
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PaddingPolicy, PagedLayout
from flashcheck.properties.csr import CsrInput
from flashcheck.targets.flashinfer.compat import FI, load_flashinfer, normalize_plan_info
from flashcheck.targets.protocol import Capacity, TargetEnv

__all__ = ["FlashInferTargetBase", "GraphSlot", "Metadata", "llama_template"]

Metadata = Literal["host", "device"]
Replan = Literal["full", "fast"]

WORKSPACE_BYTES = 128 << 20  # vLLM uses 256 MiB, SGLang 512 MiB; 128 MiB holds every shape we generate


def llama_template(page_size: int = 16, dtype: DType = "float16", causal: bool = True) -> BatchSpec:
    """Llama-3-8B-like attention heads (32 query, 8 KV, dim 128): the default shape of the non-MLA targets."""
    return BatchSpec(
        (1,),
        (1,),
        page_size=page_size,
        num_qo_heads=32,
        num_kv_heads=8,
        head_dim_qk=128,
        head_dim_vo=128,
        q_dtype=dtype,
        kv_dtype=dtype,
        causal=causal,
    )


@dataclass
class GraphSlot:
    """One captured bucket: its graph-mode wrapper, the graph, static q/out, the real batch of the last prepare."""

    wrapper: Any
    graph: Any = None
    static_q: Any = None
    static_out: Any = None
    real_batch: int = 0
    real_rows: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class FlashInferTargetBase:
    """Common state. Subclasses implement `_make_eager`, `_make_graph_wrapper`, `_plan`, `_run`."""

    name = "flashinfer"
    kind = "base"

    def __init__(
        self,
        template: BatchSpec,
        *,
        buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
        padding: str = "vllm_legacy",
        metadata: Metadata = "host",
        max_pages: int = 8192,
        max_kv_len: int = 4096,
        max_qo_len: int = 1,
        workspace_bytes: int = WORKSPACE_BYTES,
        shared_workspace: bool = True,
        paged: bool = True,
        max_total_qo: int | None = None,
        value_from_key: bool = False,
    ) -> None:
        if metadata not in ("host", "device"):
            raise InvalidArgument(f"metadata must be 'host' or 'device', got {metadata!r}")
        if list(buckets) != sorted(set(buckets)):
            raise InvalidArgument(f"buckets must be ascending and distinct, got {list(buckets)}")
        mbs = max(buckets) if buckets else 32
        self.capacity = Capacity(
            template=template,
            max_batch_size=mbs,
            max_pages=max_pages,
            max_qo_len=max_qo_len,
            max_kv_len=max_kv_len,
            max_total_qo=max_total_qo if max_total_qo is not None else mbs * max_qo_len,
            buckets=tuple(buckets),
            padding=PaddingPolicy.parse(padding),
            paged=paged,
            value_from_key=value_from_key,
        )
        self.metadata: Metadata = metadata
        self.workspace_bytes = workspace_bytes
        self.shared_workspace = shared_workspace
        self.slots: dict[int, GraphSlot] = {}
        self._eager_rows = 0

    # ---- protocol pieces shared by all ------------------------------------------------------------------------
    def config(self) -> Mapping[str, Any]:
        c = self.capacity
        return {
            "kind": self.kind,
            "buckets": list(c.buckets),
            "padding": c.padding.value,
            "metadata": self.metadata,
            "max_pages": c.max_pages,
            "max_kv_len": c.max_kv_len,
            "max_qo_len": c.max_qo_len,
            "workspace_bytes": self.workspace_bytes,
            "shared_workspace": self.shared_workspace,
            "template": c.template.to_dict(),
            **self._extra_config(),
        }

    def _extra_config(self) -> dict[str, Any]:
        return {}

    def setup(self, env: TargetEnv) -> None:
        import torch

        self.fi: FI = load_flashinfer()
        self.torch = torch
        self.env = env
        dev = env.device
        c = self.capacity
        mbs = c.max_batch_size
        self.float_ws = env.arena.workspace(
            "float_workspace", self.workspace_bytes, device=dev, kind="float", zero=False
        )
        pin = torch.device(dev).type == "cuda"
        i32 = torch.int32
        # persistent device buffers, shared by every bucket's wrapper (views), and pinned host mirrors (vLLM)
        self.qo_indptr_gpu = torch.zeros(c.max_total_qo + mbs + 1, dtype=i32, device=dev)
        self.kv_indptr_gpu = torch.zeros(mbs + 1, dtype=i32, device=dev)
        self.kv_indices_gpu = torch.zeros(c.max_pages, dtype=i32, device=dev)
        self.last_gpu = torch.zeros(mbs, dtype=i32, device=dev)
        self.kv_len_gpu = torch.zeros(mbs, dtype=i32, device=dev)
        self.qo_indptr_cpu = torch.zeros(mbs + 1, dtype=i32, pin_memory=pin)
        self.kv_indptr_cpu = torch.zeros(mbs + 1, dtype=i32, pin_memory=pin)
        self.last_cpu = torch.zeros(mbs, dtype=i32, pin_memory=pin)
        self.kv_len_cpu = torch.zeros(mbs, dtype=i32, pin_memory=pin)
        self.indices_staging = torch.zeros(c.max_pages, dtype=i32, pin_memory=pin)
        self.eager = self._make_eager()
        self._watch_int_workspace("eager", self.eager)

    def _float_ws_for(self, tag: str) -> Any:
        """The shared float workspace (vLLM) or a private one per wrapper."""
        if self.shared_workspace:
            return self.float_ws
        return self.env.arena.workspace(
            f"float_workspace[{tag}]", self.workspace_bytes, device=self.env.device, kind="float", zero=False
        )

    def _watch_int_workspace(self, tag: str, wrapper: Any) -> None:
        """Give the wrapper an int workspace from the arena (same 8 MiB FlashInfer allocates) so it is measured."""
        old = getattr(wrapper, "_int_workspace_buffer", None)
        reset = getattr(wrapper, "reset_workspace_buffer", None)
        if old is None or reset is None:
            return
        int_ws = self.env.arena.workspace(
            f"int_workspace[{tag}]",
            int(old.numel() * old.element_size()),
            device=self.env.device,
            kind="int",
            zero=False,
        )
        reset(wrapper._float_workspace_buffer, int_ws)

    # ---- metadata ----------------------------------------------------------------------------------------------
    def fill_metadata(self, layout: PagedLayout) -> int:
        """Host-side build into the pinned mirrors, then non-blocking copies to the persistent device buffers.

        Returns the number of pages used. This is the engine's per-step hot path (no device-to-host traffic).
        """
        t = self.torch
        n = layout.padded_batch_size
        self.kv_indptr_cpu[: n + 1].copy_(t.from_numpy(layout.kv_indptr))
        self.qo_indptr_cpu[: n + 1].copy_(t.from_numpy(layout.qo_indptr))
        self.last_cpu[:n].copy_(t.from_numpy(layout.kv_last_page_len))
        self.kv_len_cpu[:n].copy_(t.from_numpy(layout.seq_lens))
        tot = int(layout.kv_indptr[-1])
        self.indices_staging[:tot].copy_(t.from_numpy(layout.kv_indices[:tot]))
        self.kv_indices_gpu[:tot].copy_(self.indices_staging[:tot], non_blocking=True)
        self.kv_indptr_gpu[: n + 1].copy_(self.kv_indptr_cpu[: n + 1], non_blocking=True)
        self.qo_indptr_gpu[: n + 1].copy_(self.qo_indptr_cpu[: n + 1], non_blocking=True)
        self.last_gpu[:n].copy_(self.last_cpu[:n], non_blocking=True)
        self.kv_len_gpu[:n].copy_(self.kv_len_cpu[:n], non_blocking=True)
        return tot

    def meta(self, n: int) -> dict[str, Any]:
        """Plan inputs for a batch of `n` rows: pinned host tensors, or the device buffers (metadata='device')."""
        if self.metadata == "device":
            return {
                "qo_indptr": self.qo_indptr_gpu[: n + 1],
                "kv_indptr": self.kv_indptr_gpu[: n + 1],
                "last": self.last_gpu[:n],
                "kv_len": self.kv_len_gpu[:n],
            }
        return {
            "qo_indptr": self.qo_indptr_cpu[: n + 1],
            "kv_indptr": self.kv_indptr_cpu[: n + 1],
            "last": self.last_cpu[:n],
            "kv_len": self.kv_len_cpu[:n],
        }

    # ---- eager -------------------------------------------------------------------------------------------------
    def plan(self, layout: PagedLayout) -> None:
        tot = self.fill_metadata(layout)
        self._eager_rows = layout.real_qo_rows()
        self._plan(self.eager, layout, tot, graph=False)

    def run(self, q: Any) -> Any:
        return self._run(self.eager, q, out=None)

    # ---- graphs ------------------------------------------------------------------------------------------------
    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        t = self.torch
        slot = self.slots.get(bucket)
        if slot is None:
            slot = GraphSlot(self._make_graph_wrapper(bucket))
            self._watch_int_workspace(f"graph bs={bucket}", slot.wrapper)
            self.slots[bucket] = slot
        rows = self._static_rows(bucket)
        tpl = self.capacity.template
        slot.static_q = t.zeros((rows, tpl.num_qo_heads, tpl.head_dim_qk), dtype=q.dtype, device=q.device)
        slot.static_q[: q.shape[0]].copy_(q)
        self._capture_plan(slot, bucket, layout)
        stream = self._side_stream()
        stream.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph, as engines do
                slot.static_out = self._run(slot.wrapper, slot.static_q, out=None)
        # Captured as engines capture many graphs (vLLM): one memory pool per bucket, kept across recaptures, and
        # no device sync or cache flushes first (`capture_graph`)
        if "pool" not in slot.extra:
            slot.extra["pool"] = t.cuda.graph_pool_handle()
        try:
            graph, out = capture_graph(
                lambda: self._run(slot.wrapper, slot.static_q, out=None), slot.extra["pool"], stream
            )
        except BaseException:
            slot.graph = None  # the old graph read the replaced static_q: it must not be replayed
            raise
        # the previous graph is dropped only now: its blocks go back to the bucket's pool, which stays alive
        slot.graph, slot.static_out = graph, out
        slot.real_batch, slot.real_rows = layout.batch_size, layout.real_qo_rows()

    def _side_stream(self) -> Any:
        """The stream graphs are warmed up and captured on (one per target, as engines keep one)."""
        stream = getattr(self, "_capture_stream", None)
        if stream is None:
            cuda: Any = self.torch.cuda
            stream = self._capture_stream = cuda.Stream()
        return stream

    def _capture_plan(self, slot: GraphSlot, bucket: int, layout: PagedLayout) -> None:
        tot = self.fill_metadata(layout)
        self._plan(slot.wrapper, layout, tot, graph=True)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        slot = self.slots[bucket]
        tot = self.fill_metadata(layout)
        self._replan(slot, layout, tot)
        slot.real_batch, slot.real_rows = layout.batch_size, layout.real_qo_rows()

    def _replan(self, slot: GraphSlot, layout: PagedLayout, tot: int) -> None:
        self._plan(slot.wrapper, layout, tot, graph=True)

    def replay(self, bucket: int, q: Any) -> Any:
        slot = self.slots[bucket]
        slot.static_q[: q.shape[0]].copy_(q)
        slot.graph.replay()
        return slot.static_out[: slot.real_rows]

    def graph_metadata(self, bucket: int) -> CsrInput | None:
        c = self.capacity
        slot = self.slots[bucket]
        qo = self.qo_indptr_gpu[: bucket + 1] if self._graph_reads_qo_indptr() else None
        return CsrInput(
            kv_indptr=self.kv_indptr_gpu[: bucket + 1],
            kv_indices=self.kv_indices_gpu,
            kv_last_page_len=self.last_gpu[:bucket],
            num_pages=c.max_pages,
            page_size=c.template.page_size,
            qo_indptr=qo,
            batch_size=slot.real_batch,
            padding=c.padding,
            kv_indices_len=int(self.kv_indices_gpu.numel()),
        )

    def _graph_reads_qo_indptr(self) -> bool:
        return False

    def plan_info(self, bucket: int) -> list[int] | None:
        return normalize_plan_info(self.slots[bucket].wrapper)

    def teardown(self) -> None:
        self.slots.clear()

    # ---- subclass hooks ----------------------------------------------------------------------------------------
    def _static_rows(self, bucket: int) -> int:
        return bucket * self.capacity.max_qo_len

    def _make_eager(self) -> Any:
        raise NotImplementedError

    def _make_graph_wrapper(self, bucket: int) -> Any:
        raise NotImplementedError

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        raise NotImplementedError

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        raise NotImplementedError

    def _paged_plan_args(self, layout: PagedLayout, tot: int) -> tuple[Any, ...]:
        """The paged-CSR positional arguments that decode `plan()`, `fast_decode_plan()` and paged prefill `plan()`
        share (prefill puts its qo_indptr before them): kv_indptr, kv_indices, last_page_len, heads, page size."""
        t = self.capacity.template
        m = self.meta(layout.padded_batch_size)
        return (
            m["kv_indptr"],
            self.kv_indices_gpu[:tot],
            m["last"],
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim_qk,
            t.page_size,
        )

    def _common_kw(self) -> dict[str, Any]:
        t = self.capacity.template
        return {
            "window_left": t.window_left,
            "logits_soft_cap": t.logits_soft_cap or None,
            "sm_scale": t.scale,
            "q_data_type": getattr(self.torch, t.q_dtype),
            "kv_data_type": getattr(self.torch, t.kv_dtype),
        }
