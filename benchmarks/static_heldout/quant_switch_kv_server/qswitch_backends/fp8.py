"""FP8 (e4m3) pages: XQA decode with per-layer scales; outlier layers read a bf16 side pool through an
eager FlashInfer decode wrapper."""

from __future__ import annotations

from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, xqa_batch_decode_with_kv_cache

from qswitch.dtypes import KVClass, clamp_scales
from qswitch.metadata import DecodeMetadata
from qswitch_backends.base import KVBackend


class Fp8Backend(KVBackend):
    kv_class = KVClass.FP8

    def __init__(self, cfg, pool, ws, device):
        super().__init__(cfg, pool, ws, device)
        self._backend = "xqa"  # ok: FC103
        max_bs = cfg.max_graph_bs
        self.xqa_workspace = ws.workspaces[KVClass.FP8]
        self.k_scale = torch.ones(cfg.num_layers, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(cfg.num_layers, dtype=torch.float32, device=device)
        self.page_scales = torch.ones(cfg.fp8_pages, 2, dtype=torch.float32, device=device)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.block_table_scratch: Optional[torch.Tensor] = None
        self.outlier_layers = frozenset(cfg.fp8_outlier_layers)
        self.outlier_decode = BatchDecodeWithPagedKVCacheWrapper(ws.get(KVClass.BF16), pool._kv_layout, use_tensor_cores=True)

    def jit_ready(self) -> bool:
        """True once the outlier decode kernel has been JIT-compiled (checked before capturing)."""
        return getattr(self.outlier_decode, "_cached_module", None) is not None  # expect: FC103

    def update_scales(self, k_amax: torch.Tensor, v_amax: torch.Tensor) -> None:
        self.k_scale.copy_(clamp_scales(k_amax / self.cfg.max_scale, self.cfg.max_scale))
        self.v_scale.copy_(clamp_scales(v_amax / self.cfg.max_scale, self.cfg.max_scale))

    def init_forward_metadata(self, meta: DecodeMetadata) -> None:
        if torch.isnan(self.k_scale).any():  # expect: FC101
            self.k_scale.nan_to_num_(nan=1.0)
        num_pages = self.pool.num_fp8_pages
        if num_pages > self.page_scales.shape[0]:
            self.page_scales = torch.ones(num_pages, 2, dtype=torch.float32, device=self.device)  # expect: FC107
        if self.block_table_scratch is None:
            self.block_table_scratch = torch.zeros_like(self.block_tables)  # ok: FC107
        rows = meta.batch_size
        width = meta.block_tables.shape[1]
        self.block_tables[:rows, :width].copy_(meta.block_tables)
        self.seq_lens[:rows].copy_(meta.seq_lens_gpu)
        if self.outlier_layers:
            self.outlier_decode.plan(
                meta.kv_indptr_cpu, meta.kv_indices, meta.last_page_len_cpu, q_data_type=torch.bfloat16, **self.plan_kwargs()
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.graph_bs = bs
        self.seq_lens[:bs].fill_(1)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: DecodeMetadata) -> None:
        self.graph_bs = bs
        self.init_forward_metadata(meta)
        self.seq_lens[meta.batch_size : bs].fill_(1)

    def forward_decode(self, q: torch.Tensor, layer_id: int, bs: int) -> torch.Tensor:
        if layer_id in self.outlier_layers:
            return self.outlier_decode.run(q, self.pool.side_kv[layer_id])  # expect: FC108
        kv = self.pool.layer(KVClass.FP8, layer_id)
        return xqa_batch_decode_with_kv_cache(
            q, kv, self.xqa_workspace, self.block_tables[:bs], self.seq_lens[:bs], self.cfg.max_seq_len,
            bmm1_scale=self.k_scale[layer_id] * self.sm_scale, bmm2_scale=self.v_scale[layer_id], kv_layout="HND",
        )
