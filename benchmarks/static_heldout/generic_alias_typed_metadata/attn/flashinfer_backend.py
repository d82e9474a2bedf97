"""FlashInfer attention backend: eager decode/extend metadata and CUDA-graph decode buckets."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final, Optional, TypeAlias, cast

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from attn.trtllm_path import TrtllmLongContextDecode
from attn.workspaces import scratch_workspace
from tmeta.batch import ForwardBatch
from tmeta.config import EngineConfig
from tmeta.generic import BucketTable, MetadataSlot
from tmeta.metadata import (
    AttnMetadata,
    DecodeMetadata,
    ExtendMetadata,
    Meta,
    build_metadata,
    last_page_lens,
    total_kv_pages,
)

if TYPE_CHECKING:
    from tmeta.generic import PagePool

logger = logging.getLogger(__name__)

DecodeWrapper: TypeAlias = BatchDecodeWithPagedKVCacheWrapper


class FlashInferBackend:
    """Paged-KV attention through FlashInfer.

    Eager steps plan per-step wrappers from pinned host mirrors. Decode batches that fit a
    captured bucket run through one graph-mode wrapper per bucket, bound to the persistent
    ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len`` buffers below.
    """

    GRAPH_WORKSPACE_BYTES: Final = 128 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, pool: "PagePool", device: torch.device) -> None:
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self._kv_layout = cfg.kv_layout  # ok: FC103
        self.window_layers = frozenset(cfg.window_layers)
        self.sm_scale = cfg.head_dim**-0.5

        self.workspace = scratch_workspace(cfg.split_kv_workspace_bytes(), device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_decode = DecodeWrapper(self.workspace, self._kv_layout, use_tensor_cores=True)
        self.window_decode: Optional[DecodeWrapper] = (
            DecodeWrapper(self.workspace, self._kv_layout, use_tensor_cores=True) if cfg.sliding_window else None
        )
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        self.trtllm_workspace: Optional[torch.Tensor] = None
        self.trtllm_decode: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if cfg.decode_kernel == "trtllm-gen":
            self.trtllm_workspace = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
            self.trtllm_decode = BatchDecodeWithPagedKVCacheWrapper(
                self.trtllm_workspace, "HND", backend="trtllm-gen"
            )
        self.long_ctx: Optional[TrtllmLongContextDecode] = (
            TrtllmLongContextDecode(cfg, device) if cfg.long_context_threshold else None
        )

        max_bs = cfg.max_graph_bs
        # Most decode batches are far from max_seq_len; the indices buffer starts at a quarter.
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq // 4, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(self.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_wrappers: BucketTable[int, BatchDecodeWithPagedKVCacheWrapper] = BucketTable()
        self.graph_bufs: BucketTable[str, torch.Tensor] = (
            BucketTable[str, torch.Tensor]()
            .put("kv_indptr", self.kv_indptr)
            .put("kv_indices", self.kv_indices)
            .put("kv_last_page_len", self.kv_last_page_len)
        )

        self.decode_slot: MetadataSlot[DecodeMetadata] = MetadataSlot("decode")
        self.extend_slot: MetadataSlot[ExtendMetadata] = MetadataSlot("extend")
        self.forward_metadata: Optional[AttnMetadata] = None
        self.pages_in_flight = 0
        self._plan_info: dict[int, tuple[int, int]] = {}

    # ------------------------------------------------------------------ eager steps

    def init_forward_metadata(self, batch: ForwardBatch) -> AttnMetadata:
        meta: Meta
        if batch.kind == "decode":
            decode = self._build_decode(batch)
            self._plan_decode(decode)
            if self.long_ctx is not None and decode.use_long_ctx:
                self.long_ctx.prepare(decode, self.pool.req_to_page, batch.req_pool_indices)
            meta = self.decode_slot.publish(decode)
        else:
            extend = self._build_extend(batch)
            self._plan_extend(extend)
            meta = self.extend_slot.publish(extend)
        self.pages_in_flight = total_kv_pages(meta)
        self.forward_metadata = meta
        return meta

    def _build_decode(self, batch: ForwardBatch) -> DecodeMetadata:
        cfg = self.cfg
        bs = batch.batch_size
        seq_lens_cpu = batch.seq_lens_cpu[:bs]
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum((seq_lens_cpu + cfg.page_size - 1) // cfg.page_size, 0, dtype=torch.int32, out=kv_indptr_cpu[1:])
        last_cpu = ((seq_lens_cpu - 1) % cfg.page_size + 1).pin_memory()
        total = int(kv_indptr_cpu[-1])
        max_kv_len = int(seq_lens_cpu.max())  # ok: FC101
        kv_indptr = kv_indptr_cpu.to(self.device, non_blocking=True)
        kv_indices = torch.empty(total, dtype=torch.int32, device=self.device)
        self.pool.fill_indices(kv_indices, batch.req_pool_indices, kv_indptr, bs, total)
        return build_metadata(
            DecodeMetadata,
            batch,
            kv_indptr=kv_indptr,
            kv_indices=kv_indices,
            kv_last_page_len=last_cpu.to(self.device, non_blocking=True),
            kv_indptr_cpu=kv_indptr_cpu,
            kv_last_page_len_cpu=last_cpu,
            max_kv_len=max_kv_len,
            use_long_ctx=self.long_ctx is not None and max_kv_len > (cfg.long_context_threshold or 0),
        )

    def _plan_decode(self, meta: DecodeMetadata) -> None:
        cfg = self.cfg
        wrapper = self.trtllm_decode if self.trtllm_decode is not None else self.eager_decode
        wrapper.plan(  # ok: FC102
            meta.kv_indptr_cpu,
            meta.kv_indices,
            last_page_lens(meta, host=True),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        meta.wrapper = wrapper
        self._plan_window(meta)

    def _plan_window(self, meta: DecodeMetadata) -> None:
        window = self.window_decode
        if window is None:
            return
        cfg = self.cfg
        window.plan(
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            window_left=cast(int, cfg.sliding_window) - 1,
            q_data_type=torch.bfloat16,
        )
        meta.window_wrapper = window

    def _build_extend(self, batch: ForwardBatch) -> ExtendMetadata:
        cfg = self.cfg
        bs = batch.batch_size
        prefix_cpu = cast(torch.Tensor, batch.extend_prefix_lens_cpu)
        extend_cpu = cast(torch.Tensor, batch.extend_seq_lens_cpu)
        seq_lens_cpu = batch.seq_lens_cpu[:bs]
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum(extend_cpu, 0, dtype=torch.int32, out=qo_indptr_cpu[1:])
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum((seq_lens_cpu + cfg.page_size - 1) // cfg.page_size, 0, dtype=torch.int32, out=kv_indptr_cpu[1:])
        total = int(self.pool.page_counts(batch.req_pool_indices, batch.seq_lens).sum())  # expect: FC101
        kv_indices = torch.empty(total, dtype=torch.int32, device=self.device)
        kv_indptr = kv_indptr_cpu.to(self.device, non_blocking=True)
        self.pool.fill_indices(kv_indices, batch.req_pool_indices, kv_indptr, bs, total)
        return ExtendMetadata(
            batch_size=bs,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=batch.seq_lens_cpu,
            qo_indptr=qo_indptr_cpu.to(self.device, non_blocking=True),
            qo_indptr_cpu=qo_indptr_cpu,
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=kv_indices,
            kv_last_page_len_cpu=(seq_lens_cpu - 1) % cfg.page_size + 1,
            prefix_lens_cpu=prefix_cpu,
        )

    def _plan_extend(self, meta: ExtendMetadata) -> None:
        cfg = self.cfg
        self.prefill.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        meta.wrapper = self.prefill

    # ------------------------------------------------------------------ CUDA graphs

    def init_cuda_graph_state(self) -> None:
        """Reset the graph inputs before the buckets are captured."""
        self.graph_bufs["kv_indptr"].zero_()
        self.graph_bufs["kv_last_page_len"].fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> DecodeMetadata:
        cfg = self.cfg
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.graph_wrappers.put(bs, wrapper)
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_cpu[:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1])  # ok: FC104
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len_cpu[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        meta = DecodeMetadata(
            batch_size=bs,
            seq_lens=seq_lens,
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bs],
            kv_indptr_cpu=self.kv_indptr_cpu[: bs + 1],
            kv_last_page_len_cpu=self.kv_last_page_len_cpu[:bs],
            max_kv_len=1,
            wrapper=wrapper,
            graph_bucket=bs,
        )
        self._plan_window(meta)
        self.forward_metadata = self.decode_slot.publish(meta)
        return meta

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        raw_bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
    ) -> DecodeMetadata:
        assert raw_bs <= bs, "batch does not fit its graph bucket"  # expect: FC109
        cfg = self.cfg
        lens = seq_lens_cpu[:raw_bs]
        self.kv_indptr_cpu[0] = 0
        torch.cumsum(
            (lens + cfg.page_size - 1) // cfg.page_size, 0, dtype=torch.int32, out=self.kv_indptr_cpu[1 : raw_bs + 1]
        )
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs] = (lens - 1) % cfg.page_size + 1
        total = int(self.kv_indptr_cpu[raw_bs])
        if total > self.kv_indices.numel():
            self.kv_indices = torch.empty(2 * total, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:raw_bs].copy_(self.kv_last_page_len_cpu[:raw_bs], non_blocking=True)
        self.pool.fill_indices(self.kv_indices, req_pool_indices, self.kv_indptr, raw_bs, total)
        max_kv_len = int(seq_lens[:raw_bs].max())  # expect: FC101
        self._plan_info[bs] = (raw_bs, max_kv_len)  # ok: FC103
        wrapper = self.graph_wrappers[bs]
        wrapper.plan(  # expect: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices,
            self.kv_last_page_len[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        meta = DecodeMetadata(
            batch_size=bs,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bs],
            kv_indptr_cpu=self.kv_indptr_cpu[: bs + 1],
            kv_last_page_len_cpu=self.kv_last_page_len_cpu[:bs],
            max_kv_len=max_kv_len,
            wrapper=wrapper,
            graph_bucket=bs,
        )
        self._plan_window(meta)
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        logger.debug("replay metadata bs=%d raw_bs=%d seq_lens=%s", bs, raw_bs, seq_lens)  # ok: FC101
        self.forward_metadata = self.decode_slot.publish(meta)
        return meta

    # ------------------------------------------------------------------ forward

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        meta = self.decode_slot.get()
        if layer_id in self.window_layers:
            window = meta.window_wrapper
            assert window is not None, "window layers need a planned window wrapper"  # ok: FC109
            return window.run(q, kv_cache)  # expect: FC108
        if meta.use_long_ctx and self.long_ctx is not None:
            return self.long_ctx.decode(q, kv_cache, meta, self.sm_scale)
        wrapper = meta.wrapper
        if wrapper is None:
            raise RuntimeError("decode metadata was built without a wrapper")
        return wrapper.run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        meta = self.forward_metadata
        if not isinstance(meta, ExtendMetadata):
            raise RuntimeError(f"extend forward with {type(meta).__name__} metadata")
        return self.prefill.run(q, kv_cache)  # ok: FC108

    # ------------------------------------------------------------------ introspection

    def workspace_report(self) -> dict[str, int]:
        """Bytes held per workspace, for the memory endpoint."""
        report = {
            "fa2": self.workspace.numel(),
            "prefill": self.prefill_workspace.numel(),
            "graph": self.graph_workspace.numel(),
        }
        if self.trtllm_workspace is not None:
            report["trtllm"] = self.trtllm_workspace.numel()
        for bs, wrapper in self.graph_wrappers.items():
            report[f"graph_int/{bs}"] = wrapper._int_workspace_buffer.numel()  # expect: FC103
        for bs, (_, max_kv_len) in self._plan_info.items():
            report[f"last_plan_kv/{bs}"] = max_kv_len
        return report
