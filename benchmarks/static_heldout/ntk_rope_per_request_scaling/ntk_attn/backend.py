"""FlashInfer attention for per-request NTK scaling. Rope is applied before the kernels, so the
wrappers see rotated q; the per-row alpha lives in a static buffer the decode graphs read."""

import functools
import logging
import math
from typing import Dict

import flashinfer
import torch

from ntkserve import EAGER_DECODE_WORKSPACE_BYTES, NTKConfig, RopeCache, ScaleTable, ntk_alpha
from ntkserve.batch import StepBatch
from ntkserve.rope_cache import decode_positions
from ntk_attn.metadata import build_prefill_meta
from ntk_attn.workspaces import decode_graph_workspace, prefill_workspace

logger = logging.getLogger(__name__)


class NTKAttentionBackend:
    def __init__(self, cfg: NTKConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        mb = cfg.max_batch
        self.scales = ScaleTable(mb, cfg.trained_ctx, cfg.head_dim, device)
        self.rope = RopeCache(cfg.head_dim, cfg.trained_ctx, cfg.rope_theta, device)

        # graph-bound decode metadata, one set sliced per bucket
        self.kv_indptr_buf = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(mb, dtype=torch.int32, device=device)
        # per-row NTK alpha read by the captured rope (bound to no wrapper)
        self.row_scale_buf = torch.ones(mb, dtype=torch.float32, device=device)
        # pinned mirrors for plan()
        self.kv_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        # device copy for the eager path's epilogue
        self.last_page_len_device = torch.ones(mb, dtype=torch.int32, device=device)

        self.graph_workspace = decode_graph_workspace(cfg, device)
        self.long_workspace = decode_graph_workspace(cfg, device)
        self.eager_workspace = torch.zeros(EAGER_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        # rows past long_row_threshold: tensor-core split-kv, planned with the log-n temperature
        self.long_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.long_workspace, "NHD", use_tensor_cores=True
        )
        prefill_backend = "trtllm-gen" if cfg.use_trtllm_prefill else "fa2"
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            prefill_workspace(cfg, device), "NHD", backend=prefill_backend
        )
        self.graph_wrappers: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self.alpha_scratch = None
        self.prefill_meta = None
        self.last_alphas = []
        self.init_graph_buffers()

    # ---- set-up -------------------------------------------------------------------------
    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()  # ok: FC104
        self.last_page_len_buf.fill_(1)
        self.row_scale_buf.fill_(1.0)

    def make_graph_wrapper(self, bs: int) -> flashinfer.BatchDecodeWithPagedKVCacheWrapper:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
        )
        self.graph_wrappers[bs] = w
        return w

    def check_graph_wrappers(self) -> None:
        for bs, w in self.graph_wrappers.items():
            if w._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"bucket {bs}: wrapper was built for another batch size")

    def _decode_plan_kwargs(self, sm_scale=None) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=sm_scale,
        )

    # ---- per step (eager) ---------------------------------------------------------------
    def init_forward_metadata(self, batch: StepBatch) -> None:
        longest = int(batch.seq_lens_cpu.max())  # ok: FC101
        if longest > self.rope.cached_len:
            self.rope.extend(longest, ntk_alpha(longest, self.cfg.trained_ctx, self.cfg.head_dim))
        if self.scales.refresh(batch.slots, batch.seq_lens_cpu):
            self.scales.upload()
        if self.alpha_scratch is None:
            self.alpha_scratch = torch.empty(self.cfg.max_batch, dtype=torch.float32, device=self.device)  # ok: FC107
        torch.index_select(self.scales.factors, 0, batch.slot_index, out=self.alpha_scratch[: batch.batch_size])
        if batch.is_prefill:
            self._plan_prefill(batch)
        else:
            batch.positions_dev = decode_positions(batch.seq_lens_dev, self.rope.cached_len)
            self._plan_eager_decode(batch)

    def _plan_prefill(self, batch: StepBatch) -> None:
        meta = build_prefill_meta(batch, self.device)
        self.prefill_meta = meta
        c = self.cfg
        self.prefill_wrapper.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu,
            meta.kv_indices,
            meta.last_page_len_cpu,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def _plan_eager_decode(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        self.kv_indptr_host[: bs + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.last_page_len_host[:bs].copy_(torch.from_numpy(batch.last_page_len_np))
        self.last_page_len_device[:bs].copy_(self.last_page_len_host[:bs], non_blocking=True)
        indices = torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True)
        plan = functools.partial(self.eager_decode.plan, **self._decode_plan_kwargs())
        plan(self.kv_indptr_host[: bs + 1], indices, self.last_page_len_device[:bs])  # expect: FC102
        self._plan_long(batch, indices)

    def _plan_long(self, batch: StepBatch, indices: torch.Tensor) -> None:
        if not batch.num_long:
            return
        bs = batch.batch_size
        lo = bs - batch.num_long
        start = int(batch.kv_indptr_np[lo])
        long_indptr_cpu = self.kv_indptr_host[lo : bs + 1] - start
        temperature = math.log(self.cfg.max_ctx) / math.log(self.cfg.trained_ctx)
        self.long_decode.plan(  # ok: FC102
            long_indptr_cpu,
            indices[start:],
            self.last_page_len_host[lo:bs],
            **self._decode_plan_kwargs(sm_scale=temperature / math.sqrt(self.cfg.head_dim)),
        )

    # ---- graphs -------------------------------------------------------------------------
    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_long: int) -> None:
        w = self.make_graph_wrapper(bs)
        dummy_indptr = torch.arange(bs + 1, dtype=torch.int32)
        dummy_last = torch.ones(bs, dtype=torch.int32)
        w.plan(dummy_indptr, self.kv_indices_buf[:bs], dummy_last, **self._decode_plan_kwargs())
        self.long_decode.plan(
            dummy_indptr[: num_long + 1], self.kv_indices_buf[:num_long], dummy_last[:num_long],
            **self._decode_plan_kwargs(),
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        real_bs = batch.batch_size
        nnz = int(batch.kv_indptr_np[-1])
        if self.scales.refresh(batch.slots, batch.seq_lens_cpu):
            self.scales.upload()
        self.kv_indptr_host[: real_bs + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.kv_indptr_host[real_bs + 1 : bs + 1] = nnz
        self.last_page_len_host[:real_bs].copy_(torch.from_numpy(batch.last_page_len_np))
        self.kv_indptr_buf[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(torch.from_numpy(batch.kv_indices_np), non_blocking=True)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices_buf[:nnz],
            self.last_page_len_host[:bs],
            **self._decode_plan_kwargs(),
        )
        self._plan_long(batch, self.kv_indices_buf[:nnz])
        # padding rows attend one token of page 0
        self.last_page_len_buf[real_bs:bs].fill_(1)  # expect: FC104
        torch.index_select(self.scales.factors, 0, batch.slot_index, out=self.row_scale_buf[:real_bs])  # ok: FC104
        self.last_alphas = self.scales.factors_host[batch.slots].tolist()  # ok: FC101
        if self.scales.any_scaled:
            logger.debug("bucket %d replays NTK-scaled rows: %s", bs, self.scales.factors)  # ok: FC101

    # ---- kernels ------------------------------------------------------------------------
    def rotate_prefill(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        if self.rope._backend == "flashinfer":  # ok: FC103
            flashinfer.apply_rope_with_cos_sin_cache_inplace(
                positions, q, k, self.cfg.head_dim, self.rope.cos_sin_cache, is_neox=False
            )
            return q, k
        return self.rope.apply(q, k, positions)

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int, num_long: int) -> torch.Tensor:
        w = self.graph_wrappers[bs] if bs in self.graph_wrappers else self.eager_decode
        out = w.run(q, kv_cache)  # ok: FC108
        if num_long:
            out[-num_long:] = self.long_decode.run(q[-num_long:], kv_cache)  # expect: FC108
        return out
