"""FlashInfer attention for the MInference engine.

Long prompts run a block-sparse prefill whose layout is estimated per layer from the last
query block; short prompts fall back to a dense paged prefill. Decode runs eager wrappers
or one graph-mode wrapper per captured bucket over shared index buffers.
"""

import logging
from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BlockSparseAttentionWrapper,
)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from mfserve import BSRLayout, MInferenceConfig, VerticalSlashEstimator, VSIndex, build_bsr
from mf_attn.metadata import DecodeMeta, PrefillMeta, StepBatch, StepMeta
from mf_attn.workspace import context_workspace, decode_workspace, prefill_workspace, sparse_workspace

logger = logging.getLogger(__name__)


class MInferenceBackend:
    def __init__(self, cfg: MInferenceConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5
        self.estimator = VerticalSlashEstimator(cfg, device)
        self.decode_ws = decode_workspace(cfg, device)
        self.long_ws = decode_workspace(cfg, device)
        self.prefill_ws = prefill_workspace(cfg, device)
        self.sparse_ws = sparse_workspace(device)
        self.ctx_ws = context_workspace(cfg, device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, cfg.kv_layout, backend="fa2")
        self.long_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.long_ws, cfg.kv_layout, use_tensor_cores=True
        )
        self.dense_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, cfg.kv_layout, backend="fa2")
        self.sparse_wrapper = BlockSparseAttentionWrapper(self.sparse_ws)
        self._decode_plan = self.decode_wrapper.plan
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.split_long_rows = cfg.split_long_rows
        self.sparse_active = False
        self.last_q_scores: Optional[torch.Tensor] = None
        self.count_scratch: Optional[torch.Tensor] = None
        self.prefill_qo_scratch = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        max_q_blocks = cfg.max_num_tokens // cfg.block_size
        self.bsr_indptr_pinned = torch.zeros(max_q_blocks + 1, dtype=torch.int32, pin_memory=True)
        self.bsr_indices_pinned = torch.zeros(max_q_blocks * max_q_blocks // 8, dtype=torch.int32, pin_memory=True)
        self._prefill_meta: Optional[PrefillMeta] = None

    # ------------------------------------------------------------------ set-up
    def init_graph_wrappers(self) -> None:
        cfg = self.cfg
        mb = max(cfg.decode_buckets)
        self.kv_indptr_buf = torch.zeros(mb + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_buf = torch.ones(mb, dtype=torch.int32, device=self.device)
        self.pages_per_row = torch.zeros(mb, dtype=torch.int32, device=self.device)
        self.row_ids = torch.arange(mb, dtype=torch.int32, device=self.device)
        self.kv_indptr_pinned = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_pinned = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.kv_indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_pinned_np = self.kv_indptr_pinned.numpy()
        self.kv_last_pinned_np = self.kv_last_pinned.numpy()
        self.kv_indices_pinned_np = self.kv_indices_pinned.numpy()
        self.graph_ws = decode_workspace(cfg, self.device)
        for bs in cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                cfg.kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
            )
        self.kv_indptr_buf.zero_()  # ok: FC104

    # ------------------------------------------------------------ per step
    def init_forward_metadata(self, batch: StepBatch, meta: StepMeta) -> None:
        if not batch.is_prefill:
            self.plan_decode(meta)
            return
        self._prefill_meta = meta
        use_sparse = bool((batch.seq_lens >= self.cfg.min_sparse_len).any())  # expect: FC101
        self.sparse_active = use_sparse
        if not use_sparse:
            self._plan_dense(meta)
            return
        cfg = self.cfg
        max_kv = int(batch.seq_lens_np.max())
        if self.last_q_scores is None or self.last_q_scores.shape[-1] < max_kv:
            self.last_q_scores = torch.empty((cfg.num_qo_heads, cfg.last_q, max_kv), dtype=torch.float32, device=self.device)  # expect: FC107
        if self.count_scratch is None:
            self.count_scratch = torch.zeros(cfg.max_num_tokens // cfg.block_size, dtype=torch.int32, device=self.device)  # ok: FC107

    def plan_decode(self, meta: DecodeMeta) -> None:
        cfg = self.cfg
        self._decode_plan(  # expect: FC102
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.last_page_len_device,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )
        if self.split_long_rows and meta.num_long > 0:
            self.long_decode_wrapper.plan(  # ok: FC102
                meta.long_indptr_cpu,
                meta.long_indices,
                meta.long_last_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                sm_scale=self.sm_scale,
            )

    def _plan_dense(self, meta: PrefillMeta) -> None:
        cfg = self.cfg
        self.dense_prefill.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )

    def _plan_sparse(self, vs: VSIndex, layer: int) -> BSRLayout:
        cfg = self.cfg
        layout = build_bsr(vs)
        logger.debug("layer %d sparse cells %s", layer, vs.block_counts)  # ok: FC101
        nq, nnz = layout.num_q_blocks, layout.nnz
        self.bsr_indptr_pinned.numpy()[: nq + 1] = layout.indptr
        self.bsr_indices_pinned.numpy()[:nnz] = layout.indices
        self.sparse_wrapper.plan(
            self.bsr_indptr_pinned[: nq + 1],
            self.bsr_indices_pinned[:nnz],
            layout.num_q_blocks * cfg.block_size,
            layout.num_kv_blocks * cfg.block_size,
            cfg.block_size,
            cfg.block_size,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            causal=False,
            sm_scale=self.sm_scale,
        )
        if getattr(self.sparse_wrapper, "_plan_info", None) is None:  # expect: FC103
            raise RuntimeError(f"block-sparse plan produced no plan for layer {layer}")
        return layout

    def sparse_kernels_loaded(self) -> bool:
        return self.sparse_wrapper._cached_module is not None  # expect: FC103

    def _require_sparse(self) -> None:
        assert self._prefill_meta is not None, "init_forward_metadata must run before the sparse prefill"  # ok: FC109

    # -------------------------------------------------------------- forward
    def forward_sparse_prefill(self, q, k, v, kv_cache, layer: int, new_pages: torch.Tensor) -> torch.Tensor:
        self._require_sparse()
        vs = self.estimator.estimate(q, k, layer, scratch=self.last_q_scores)
        self._plan_sparse(vs, layer)
        n = new_pages.numel()
        # stage the prompt's pages for the scatter below
        self.kv_indices_buf[:n].copy_(new_pages)  # expect: FC104
        self._scatter_prompt_kv(kv_cache, k, v, self.kv_indices_buf[:n])
        meta = self._prefill_meta
        m = meta.qo_indptr.numel()
        self.prefill_qo_scratch[:m].copy_(meta.qo_indptr)  # ok: FC104
        return self.sparse_wrapper.run(q, k, v)

    def _scatter_prompt_kv(self, kv_cache, k, v, pages: torch.Tensor) -> None:
        ps = self.cfg.page_size
        n_tok = k.shape[0]
        offs = torch.arange(n_tok, device=pages.device) % ps
        slots = pages.long().repeat_interleave(ps)[:n_tok] * ps + offs
        kv_cache[:, 0].reshape(-1, *k.shape[1:]).index_copy_(0, slots, k)
        kv_cache[:, 1].reshape(-1, *v.shape[1:]).index_copy_(0, slots, v)

    def forward_dense_prefill(self, q, kv_cache, meta: PrefillMeta, batch: StepBatch) -> torch.Tensor:
        if not self.cfg.use_trtllm_context:
            return self.dense_prefill.run(q, kv_cache)
        kv_cu = np.zeros(batch.batch_size + 1, dtype=np.int32)
        np.cumsum(batch.seq_lens_np, out=kv_cu[1:])
        return trtllm_batch_context_with_kv_cache(
            q,
            kv_cache,
            self.ctx_ws,
            torch.from_numpy(batch.page_table_np).to(self.device, non_blocking=True),
            batch.seq_lens,
            meta.max_q_len,
            int(batch.seq_lens_np.max()),
            self.sm_scale,
            1.0,
            batch.batch_size,
            meta.qo_indptr,
            torch.from_numpy(kv_cu).to(self.device, non_blocking=True),
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: StepBatch) -> torch.Tensor:
        bs = fb.batch_size
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.decode_wrapper
        out = w.run(q, kv_cache)  # ok: FC108
        if self.split_long_rows:
            # rows past long_ctx_len are recomputed with the tensor-core split-kv wrapper
            q_long = q.index_select(0, fb.long_rows)
            out_long = self.long_decode_wrapper.run(q_long, kv_cache)  # expect: FC108
            out.index_copy_(0, fb.long_rows, out_long)
        return out

    # --------------------------------------------------------- cuda graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        cfg = self.cfg
        self.kv_indptr_pinned_np[: bs + 1] = 0
        self.kv_last_pinned_np[:bs] = 1
        self.graph_wrappers[bs].plan(
            self.kv_indptr_pinned[: bs + 1],
            self.kv_indices_buf,
            self.kv_last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, real_bs: int, seq_lens_np: np.ndarray, page_table_np: np.ndarray
    ) -> torch.Tensor:
        cfg = self.cfg
        ps = cfg.page_size
        lens = np.zeros(bs, dtype=np.int64)
        lens[:real_bs] = seq_lens_np[:real_bs]
        pages = (lens + ps - 1) // ps
        indptr = self.kv_indptr_pinned_np[: bs + 1]
        indptr[0] = 0
        np.cumsum(pages, out=indptr[1:])
        nnz = int(indptr[-1])
        for i in range(real_bs):
            self.kv_indices_pinned_np[indptr[i] : indptr[i + 1]] = page_table_np[i, : pages[i]]
        self.kv_last_pinned_np[:real_bs] = lens[:real_bs] - (pages[:real_bs] - 1) * ps
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_pinned[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(self.kv_indices_pinned[:nnz], non_blocking=True)
        self.kv_last_page_buf[:real_bs].copy_(self.kv_last_pinned[:real_bs], non_blocking=True)
        self.pages_per_row[:bs].copy_(torch.from_numpy(pages.astype(np.int32)), non_blocking=True)
        page_rows = torch.repeat_interleave(self.row_ids[:bs], self.pages_per_row[:bs], output_size=nnz)  # ok: FC101
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_pinned[: bs + 1],
            self.kv_indices_buf[:nnz],
            self.kv_last_pinned[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=self.sm_scale,
        )
        self.kv_last_page_buf[real_bs:bs].fill_(1)  # expect: FC104
        return page_rows
