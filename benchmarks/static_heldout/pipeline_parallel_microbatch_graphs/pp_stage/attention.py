"""Per-stage FlashInfer state: eager and graph-mode wrappers, planned once per microbatch."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Iterable, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ppserve.config import PREFILL_WS_MB, PipelineConfig, StageSpec
from ppserve.microbatch import Microbatch

logger = logging.getLogger(__name__)


def _long_ctx_workspace(cfg: PipelineConfig, device: torch.device) -> torch.Tensor:
    # trtllm-gen decode for sequences past the long-context threshold; sized for a full microbatch
    nbytes = cfg.microbatch_size * cfg.num_qo_heads * 8192 + (32 << 20)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


@dataclass
class StageForwardMeta:
    """Everything this stage's layers read for one microbatch."""

    mb_id: int
    bs: int
    num_tokens: int
    is_prefill: bool
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor
    prefill_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    window_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    use_long_ctx: bool = False
    workspace: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_seq_len: int = 0


class StageAttention:
    """Wrappers and index buffers of one pipeline stage; each microbatch is planned before it runs."""

    def __init__(self, cfg: PipelineConfig, spec: StageSpec, device):
        self.cfg = cfg
        self.spec = spec
        self.device = torch.device(device)
        self._kv_layout = "HND"
        max_bs = cfg.microbatch_size
        max_pages = max_bs * cfg.max_pages_per_seq()

        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.prefill_workspace = torch.zeros(PREFILL_WS_MB << 20, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout, use_tensor_cores=True)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self._plan_prefill = self.prefill_wrapper.plan
        self.long_ctx_ws = _long_ctx_workspace(cfg, self.device)

        # graph-bound buffers shared by every bucket of this stage
        self.graph_workspace = torch.empty(cfg.graph_ws_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    @property
    def kv_layout(self) -> str:
        layout = self._kv_layout  # ok: FC103
        return layout

    @property
    def last_page_len(self) -> torch.Tensor:
        return self.last_page_len_buf

    def init_graph_wrappers(self, buckets: Iterable[int]) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self.kv_layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        logger.info("stage %d: %d graph decode wrappers", self.spec.stage_id, len(self.graph_wrappers))

    def prepare_microbatch(self, mb: Microbatch, bucket: Optional[int]) -> StageForwardMeta:
        """Plan every wrapper this stage's layers use for ``mb``; fill the graph buffers for ``bucket``."""
        cfg = self.cfg
        if mb.is_prefill:
            self._plan_prefill(  # expect: FC102
                mb.qo_indptr,
                mb.kv_indptr_cpu,
                mb.kv_indices,
                mb.kv_last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                sm_scale=cfg.sm_scale,
                q_data_type=cfg.dtype,
            )
            return StageForwardMeta(mb.mb_id, mb.bs, mb.num_tokens, True, mb.slot_pages, mb.slot_offsets,
                                    prefill_wrapper=self.prefill_wrapper)

        max_kv = mb.seq_lens.max().item()  # expect: FC101
        if max_kv > cfg.long_context_threshold:
            return self._long_ctx_meta(mb)

        self._plan_window(mb)
        if bucket is None:
            self._plan_eager(mb)
            return StageForwardMeta(mb.mb_id, mb.bs, mb.num_tokens, False, mb.slot_pages, mb.slot_offsets,
                                    decode_wrapper=self.decode_eager, window_wrapper=self.window_decode)

        n = mb.bs
        nnz = int(mb.kv_indptr_cpu[n])
        self.kv_indptr_host[: n + 1] = mb.kv_indptr_cpu
        self.kv_indptr_host[n + 1: bucket + 1] = nnz
        self.kv_indptr_buf[: bucket + 1].copy_(self.kv_indptr_host[: bucket + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(mb.kv_indices[:nnz], non_blocking=True)
        self.last_page_len_buf[:n].copy_(mb.kv_last_page_len_cpu, non_blocking=True)
        wrapper = self.graph_wrappers[bucket]
        wrapper.plan(  # expect: FC102
            self.kv_indptr_host[: bucket + 1],
            self.kv_indices_buf,
            self.last_page_len[:bucket],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        return StageForwardMeta(mb.mb_id, mb.bs, mb.num_tokens, False, mb.slot_pages, mb.slot_offsets,
                                decode_wrapper=wrapper, window_wrapper=self.window_decode)

    def _plan_eager(self, mb: Microbatch) -> None:
        cfg = self.cfg
        self.decode_eager.plan(  # ok: FC102
            mb.kv_indptr_cpu,
            mb.kv_indices,
            mb.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def _plan_window(self, mb: Microbatch) -> None:
        # sliding-window layers read the same pages; the kernel skips what lies left of the window
        cfg = self.cfg
        self.window_decode.plan(  # ok: FC102
            mb.kv_indptr_cpu,
            mb.kv_indices,
            mb.kv_last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            window_left=cfg.sliding_window - 1,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )

    def _long_ctx_meta(self, mb: Microbatch) -> StageForwardMeta:
        max_len = int(mb.seq_lens_cpu.max())  # ok: FC101
        return StageForwardMeta(
            mb.mb_id, mb.bs, mb.num_tokens, False, mb.slot_pages, mb.slot_offsets,
            use_long_ctx=True,
            workspace=self.long_ctx_ws,
            block_tables=mb.block_tables,
            seq_lens=mb.seq_lens,
            max_seq_len=max_len,
        )
