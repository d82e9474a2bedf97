"""FlashInfer backend: eager full/sliding-window decode, ragged and paged prefill, graph decode per bucket, and the
trtllm-gen path (graph wrappers per bucket, an MTP draft wrapper, a direct kernel past the last bucket)."""

from __future__ import annotations

import functools
import logging
import operator
from typing import Dict, Optional

import attrs
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from apm.config import SWA_WORKSPACE_BYTES, VERIFY_WORKSPACE_BYTES, EngineConfig, prefix_workspace_bytes
from apm.metadata import DecodeMetadata, ForwardBatch, PrefillMetadata, VerifyMetadata, WrapperSnapshot

logger = logging.getLogger(__name__)
U8 = torch.uint8


class TrtllmGenPath:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device, max_bs = cfg, device, cfg.max_batch_size
        self._backend = "trtllm-gen"  # ok: FC103
        i32 = dict(dtype=torch.int32, device=device)
        self.block_indptr = torch.zeros(max_bs + 1, **i32)
        self.block_ids = torch.zeros(max_bs * cfg.max_pages_per_seq, **i32)
        self.block_last_len = torch.ones(max_bs, **i32)
        self.block_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.block_last_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.draft_seq_lens = torch.zeros(max_bs, **i32)
        self.graph_workspace = torch.empty(cfg.split_kv_workspace_bytes, dtype=U8, device=device)  # expect: FC105
        self.draft_workspace = torch.empty(cfg.split_kv_workspace_bytes // 4, dtype=U8, device=device)  # ok: FC105
        self.draft_workspace.zero_()
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, cfg.kv_layout, backend=self._backend)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.direct_workspace: Optional[torch.Tensor] = None
        self.overflow_block_tables: Optional[torch.Tensor] = None

    def init_wrappers(self) -> None:
        self.block_last_len.fill_(1)  # ok: FC104
        if self.cfg.decode_backend != "trtllm-gen":
            return
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self.cfg.kv_layout, use_cuda_graph=True, backend="trtllm-gen",
                paged_kv_indptr_buffer=self.block_indptr[: bs + 1], paged_kv_indices_buffer=self.block_ids,
                paged_kv_last_page_len_buffer=self.block_last_len[:bs],
            )

    def plan_capture(self, bs: int) -> None:
        self.block_indptr_cpu[: bs + 1] = 0
        self.graph_wrappers[bs].plan(self.block_indptr_cpu[: bs + 1], self.block_ids, self.block_last_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102

    def plan_replay(self, bs: int, batch: ForwardBatch) -> None:
        raw_bs = batch.batch_size
        need = int(batch.kv_indptr[raw_bs])  # expect: FC101
        if need > self.block_ids.numel():
            self.block_ids.resize_(need)  # expect: FC107
        self.block_ids[:need].copy_(batch.kv_indices[:need], non_blocking=True)  # ok: FC104
        self.block_indptr_cpu[: raw_bs + 1] = batch.kv_indptr_cpu
        self.block_indptr_cpu[raw_bs + 1 : bs + 1] = batch.kv_indptr_cpu[raw_bs]
        self.block_last_len_cpu[:raw_bs] = batch.kv_last_page_len_cpu
        self.block_last_len_cpu[raw_bs:bs] = 1
        self.graph_wrappers[bs].plan(self.block_indptr_cpu[: bs + 1], self.block_ids, self.block_last_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        # padded rows read no page at all
        self.block_last_len[raw_bs:bs].zero_()  # expect: FC104

    def plan_draft(self, meta: DecodeMetadata) -> None:
        self.draft_seq_lens = meta.seq_lens.clone()  # expect: FC107
        qo_heads, kv_heads, head_dim, page_size = self.cfg.plan_dims()
        kwargs = dict(indptr=meta.kv_indptr, indices=meta.kv_indices, last_page_len=meta.kv_last_page_len,
                      num_qo_heads=qo_heads, num_kv_heads=kv_heads, head_dim=head_dim, page_size=page_size)
        self.draft_wrapper.plan(**kwargs)  # expect: FC102

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        if meta.bucket is None and meta.seq_lens_cpu.shape[0] > self.cfg.graph_buckets[-1]:
            return self.decode_overflow(q, kv_cache, meta)
        w = self.graph_wrappers[meta.bucket] if meta.bucket in self.graph_wrappers else meta.wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out = self.draft_wrapper.run(q, kv_cache)  # expect: FC108
        return out * (self.draft_seq_lens[: q.shape[0], None, None] > 0)  # padded rows stay zero

    def decode_overflow(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        bs = meta.seq_lens_cpu.shape[0]
        assert bs > self.cfg.graph_buckets[-1], f"batch of {bs} fits a graph bucket"  # expect: FC109
        if self.direct_workspace is None:
            self.direct_workspace = torch.empty(self.cfg.split_kv_workspace_bytes, dtype=U8, device=self.device)  # expect: FC105
        if self.overflow_block_tables is None:
            shape = (self.cfg.max_batch_size, self.cfg.max_pages_per_seq)
            self.overflow_block_tables = torch.zeros(shape, dtype=torch.int32, device=self.device)  # ok: FC107
        cols = torch.arange(self.cfg.max_pages_per_seq, device=self.device)
        starts, lens = meta.kv_indptr[:-1, None], (meta.kv_indptr[1:] - meta.kv_indptr[:-1])[:, None]
        idx = (starts + cols).clamp_(max=meta.kv_indices.numel() - 1)
        tables = self.overflow_block_tables[:bs]
        tables.copy_(torch.where(cols < lens, meta.kv_indices[idx], 0))  # ok: FC101
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, self.direct_workspace, tables, meta.seq_lens, meta.max_kv_len,
                                                 bmm1_scale=self.cfg.head_dim**-0.5, bmm2_scale=1.0)

    def reset(self) -> None:
        self.block_ids.zero_()  # expect: FC104

    def workspace_report(self) -> dict:
        rows = {}
        for bs, w in self.graph_wrappers.items():
            indptr = vars(w)["_paged_kv_indptr_buf"]  # expect: FC103
            int_ws = w._int_workspace_buffer  # expect: FC103
            rows[bs] = (indptr.numel(), int_ws.numel())
        return rows


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device, max_bs = cfg, device, cfg.max_batch_size
        i32 = dict(dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, **i32)
        self.kv_last_page_len = torch.empty(max_bs, **i32)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.decode_workspace = torch.empty(cfg.split_kv_workspace_bytes, dtype=U8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, cfg.kv_layout)
        self.swa_workspace = torch.zeros(SWA_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        self.swa_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.swa_workspace, cfg.kv_layout)
        self._plan_swa = functools.partial(self.swa_wrapper.plan, window_left=(cfg.sliding_window or 0) - 1)
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=U8, device=device)  # ok: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, cfg.kv_layout)
        self.prefix_workspace = torch.empty(prefix_workspace_bytes(), dtype=U8, device=device)  # expect: FC106
        self.paged_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_workspace, cfg.kv_layout)
        self.verify_workspace = torch.empty(VERIFY_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        self.tree_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.verify_workspace, cfg.kv_layout)
        self.fa2_graph_workspace = torch.empty(cfg.GRAPH_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.capture_meta: Dict[int, DecodeMetadata] = {}
        self.trtllm = TrtllmGenPath(cfg, device)
        self._plan_info: Dict[int, int] = {}  # pages planned per bucket, for the stats endpoint
        one = torch.ones(1, **i32)
        self._warmup_meta = DecodeMetadata(self.decode_wrapper, self.swa_wrapper, torch.tensor([0, 1], **i32), one - 1, one,
                                           one, torch.ones(1, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32))

    def init_cuda_graph_wrappers(self) -> None:
        assert not torch.cuda.is_current_stream_capturing()  # ok: FC109
        self.kv_indptr.zero_()  # ok: FC104
        for bs in self.cfg.graph_buckets:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.fa2_graph_workspace, self.cfg.kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            # releases before 0.2.6 derived it from the indptr buffer, one too many
            setattr(w, "_fixed_batch_size", bs)  # expect: FC103
            self.graph_wrappers[bs] = w
        self.trtllm.init_wrappers()

    def init_forward_metadata(self, batch: ForwardBatch):
        return self._init_decode(batch) if batch.is_decode else self._init_extend(batch)

    def _init_decode(self, batch: ForwardBatch) -> DecodeMetadata:
        meta = DecodeMetadata(
            wrapper=self.decode_wrapper, swa_wrapper=self.swa_wrapper, kv_indptr=batch.kv_indptr,
            kv_indices=batch.kv_indices, kv_last_page_len=batch.kv_last_page_len, seq_lens=batch.seq_lens,
            seq_lens_cpu=batch.seq_lens_cpu, kv_indptr_cpu=batch.kv_indptr_cpu,
        )
        plan_decode = self.decode_wrapper.plan
        plan_decode(batch.kv_indptr_cpu, batch.kv_indices, meta.kv_last_page_len, *self.cfg.plan_dims())  # expect: FC102
        if self.cfg.swa_layers:
            if (batch.seq_lens > self.cfg.sliding_window).any():  # expect: FC101
                self._plan_swa(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims())  # expect: FC102
            else:
                meta.swa_wrapper = self.decode_wrapper  # nothing left the window: reuse the full plan
        return meta

    def _init_extend(self, batch: ForwardBatch) -> PrefillMetadata:
        meta = PrefillMetadata(
            ragged=self.ragged_wrapper, paged=self.paged_wrapper, qo_indptr=batch.qo_indptr,
            qo_indptr_host=batch.qo_indptr, prefix_lens_cpu=batch.prefix_lens_cpu,
        )
        dims = self.cfg.plan_dims()
        self.ragged_wrapper.plan(meta.qo_indptr_host, meta.qo_indptr_host, *dims[:3], causal=True)  # ok: FC102
        if batch.prefix_lens_cpu is not None and batch.prefix_lens_cpu.any():  # ok: FC101
            self.paged_wrapper.plan(meta.qo_indptr_host, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, *dims, causal=False)  # expect: FC102
        arange = torch.arange(batch.batch_size, device=self.device)
        meta.token_rows.copy_(torch.repeat_interleave(arange, batch.extend_lens, output_size=meta.num_tokens))  # ok: FC101
        return meta

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> DecodeMetadata:
        assert bs in self.graph_wrappers, f"no graph wrapper for bucket {bs}"  # expect: FC109
        w = self.graph_wrappers[bs]
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        w.plan(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], *self.cfg.plan_dims())  # expect: FC102
        meta = attrs.evolve(
            self._warmup_meta, wrapper=w, kv_indptr=self.kv_indptr[: bs + 1], kv_indices=self.kv_indices,
            kv_last_page_len=self.kv_last_page_len[:bs], seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32), kv_indptr_cpu=self.kv_indptr_cpu[: bs + 1], bucket=bs,
        )
        self.capture_meta[bs] = meta
        return meta

    def capture_verify_metadata(self, bs: int) -> VerifyMetadata:
        n, dims = self.cfg.num_draft_tokens, self.cfg.plan_dims()
        qo_indptr_cpu = torch.arange(0, (bs + 1) * n, n, dtype=torch.int32)
        self.paged_wrapper.plan(qo_indptr_cpu, self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], *dims, causal=False)  # expect: FC102
        self.tree_wrapper.plan(qo_indptr_cpu, qo_indptr_cpu, *dims[:3], causal=True)  # ok: FC102
        return VerifyMetadata(self.paged_wrapper, self.tree_wrapper, qo_indptr_cpu, n)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> DecodeMetadata:
        raw_bs = batch.batch_size
        n = int(batch.kv_indptr_cpu[raw_bs])  # ok: FC101
        logger.debug("replay bs=%d raw=%d tokens=%d", bs, raw_bs, batch.seq_lens.sum().item())  # expect: FC101
        if n > self.kv_indices.numel():
            self.kv_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr_cpu[: raw_bs + 1] = batch.kv_indptr_cpu
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = n
        self.kv_last_page_len_cpu[:raw_bs] = batch.kv_last_page_len_cpu
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(batch.kv_indices[:n], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:raw_bs].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self._plan_info[bs] = n  # ok: FC103
        return self.capture_meta[bs]

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata, layer_id: int):
        if self.cfg.is_swa_layer(layer_id):
            return meta.swa_wrapper.run(q, kv_cache)  # expect: FC108
        return meta.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_verify(self, q, k, v, kv_cache: torch.Tensor, meta: VerifyMetadata) -> torch.Tensor:
        o_prefix, lse_prefix = meta.prefix.run_return_lse(q, kv_cache)  # expect: FC108
        o_tree, lse_tree = meta.tree.run_return_lse(q, k, v)  # expect: FC108
        return merge_state(o_prefix, lse_prefix, o_tree, lse_tree)[0]

    def forward_extend(self, q, k, v, kv_cache: torch.Tensor, meta: PrefillMetadata) -> torch.Tensor:
        if meta.prefix_lens_cpu is None:
            return meta.ragged.run(q, k, v)  # ok: FC108
        o_prefix, lse_prefix = meta.paged.run_return_lse(q, kv_cache)  # ok: FC108
        o_new, lse_new = meta.ragged.run_return_lse(q, k, v)
        return merge_state(o_prefix, lse_prefix, o_new, lse_new)[0]

    def debug_state(self) -> dict:
        graph_mode = {bs: getattr(w, "_use_cuda_graph") for bs, w in self.graph_wrappers.items()}  # expect: FC103
        float_ws = list(map(operator.attrgetter("_float_workspace_buffer"), self.graph_wrappers.values()))  # expect: FC103
        eager_graph_mode = self.decode_wrapper.is_cuda_graph_enabled  # ok: FC103
        snaps = [WrapperSnapshot("decode", self.decode_wrapper), WrapperSnapshot("swa", self.swa_wrapper)]
        pages = self.kv_indptr.max().item()  # ok: FC101
        return {"snapshots": snaps, "graph_mode": graph_mode, "eager": eager_graph_mode, "float_ws": float_ws, "pages": pages}
