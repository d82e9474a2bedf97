"""FlashInfer attention for a model mixing sliding-window and global layers."""

from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from swaring import SWAConfig
from swa_attn.metadata import WindowStepMeta
from swa_attn.workspaces import fa2_decode_workspace, graph_workspace, trtllm_workspace

_EAGER_FLAG = "_use_cuda_graph"


def _pad_rows(indptr: torch.Tensor, real: int, padded: int) -> None:
    """Padding rows get empty page ranges: repeat the last offset."""
    indptr[real + 1 : padded + 1] = indptr[real]


class SlidingWindowBackend:
    def __init__(self, cfg: SWAConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        dev = str(device)
        self.decode_ws = fa2_decode_workspace(cfg.decode_workspace_bytes(), dev)
        self.prefill_ws = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_ws = trtllm_workspace(cfg.decode_workspace_bytes(), dev)
        self.graph_ws = graph_workspace(dev)
        self.window_decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", use_tensor_cores=True)
        self.global_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", use_tensor_cores=True)
        self.window_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.global_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        self.graph_window: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._plan_info: Dict[str, int] = {}  # ok: FC103
        self.init_cuda_graph_state()

    def init_cuda_graph_state(self) -> None:
        max_bs, R = self.cfg.max_batch_size, self.cfg.ring_pages
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_bs * R, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.window_offsets = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.graph_window[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    @staticmethod
    def _set_graph_mode(w: BatchDecodeWithPagedKVCacheWrapper, on: bool) -> None:
        setattr(w, _EAGER_FLAG, on)  # expect: FC103

    def run_oversized(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Batches above the largest bucket reuse its wrapper outside the graph."""
        w = self.graph_window[max(self.graph_window)]
        self._set_graph_mode(w, False)
        try:
            return w.run(q, kv)
        finally:
            self._set_graph_mode(w, True)

    # ---- metadata --------------------------------------------------------------------------
    def _plan_args(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def init_forward_metadata(self, meta: WindowStepMeta) -> None:
        bs = meta.batch_size
        self.window_decode_eager.plan(  # expect: FC102
            meta.win_indptr_cpu, meta.win_indices, meta.win_last_page_len, *self._plan_args(),
            window_left=self.cfg.window - 1,
        )
        self.global_decode.plan(  # ok: FC102
            meta.glb_indptr_cpu, meta.glb_indices, meta.glb_last_page_len_cpu[:bs], *self._plan_args(),
        )
        self._plan_info["decode_bs"] = bs

    def plan_prefill(self, q_lens: list, meta: WindowStepMeta) -> None:
        qo_indptr = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        self.window_prefill.plan(qo_indptr, meta.win_indptr_cpu, meta.win_indices, meta.win_last_page_len_cpu,
                                 *self._plan_args(), causal=True, window_left=self.cfg.window - 1)
        self.global_prefill.plan(qo_indptr, meta.glb_indptr_cpu, meta.glb_indices, meta.glb_last_page_len_cpu,
                                 *self._plan_args(), causal=True)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: WindowStepMeta) -> None:
        real = meta.batch_size
        self.kv_indptr_cpu[: real + 1].copy_(meta.win_indptr_cpu)
        self.kv_indptr_cpu[real + 1 : bs + 1] = self.kv_indptr_cpu[real]
        self.kv_last_page_len_cpu[:real].copy_(meta.win_last_page_len_cpu)
        n = int(self.kv_indptr_cpu[real])
        self.kv_indices[:n].copy_(meta.win_indices[:n], non_blocking=True)  # ok: FC104
        self.kv_indptr[: real + 1].copy_(self.kv_indptr_cpu[: real + 1], non_blocking=True)
        self.graph_window[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices, self.kv_last_page_len_cpu[:bs], *self._plan_args(),
            window_left=self.cfg.window - 1,
        )
        _pad_rows(self.kv_indptr, real, bs)  # expect: FC104
        self.window_offsets[:real].copy_(meta.window_offsets_cpu, non_blocking=True)  # ok: FC104

    # ---- forward ---------------------------------------------------------------------------
    def forward_decode(self, layer: int, q: torch.Tensor, kv: torch.Tensor, meta: WindowStepMeta,
                       padded_bs: int) -> torch.Tensor:
        if self.cfg.is_global(layer):
            if meta.use_trtllm:
                return trtllm_batch_decode_with_kv_cache(
                    q, kv, self.trtllm_ws, meta.block_tables, meta.seq_lens, self.cfg.max_context_len,
                    bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0)
            return self.global_decode.run(q, kv)  # expect: FC108
        w = self.graph_window.get(padded_bs) or self.window_decode_eager
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, layer: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        w = self.global_prefill if self.cfg.is_global(layer) else self.window_prefill
        return w.run(q, kv)
