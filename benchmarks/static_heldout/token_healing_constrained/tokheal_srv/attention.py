"""Attention of the healing server.

* graph-mode decode wrappers per bucket for constrained decode,
* an eager decode wrapper for batches past the largest bucket,
* an eager paged prefill for re-prefilling the backed-off prompt tail,
* an eager paged prefill that verifies the speculative prefix drafts,
* trtllm-gen decode for single very long requests.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tokheal.config import HealConfig, WsTier
from tokheal_srv.pages import PageLayout


class HealAttention:
    def __init__(self, cfg: HealConfig, kv_caches: List[torch.Tensor], device: torch.device) -> None:
        self.cfg = cfg
        self.kv = kv_caches
        self.device = device
        fa2_bytes = cfg.max_num_tokens * cfg.num_q_heads * (cfg.head_dim + 1) * 8
        self.fa2_workspace = torch.empty(fa2_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trt_workspace = torch.zeros(cfg.trtllm_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.zeros(WsTier.GRAPH, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.fa2_workspace, "NHD", backend="fa2")
        self.heal_prefill = BatchPrefillWithPagedKVCacheWrapper(self.fa2_workspace, "NHD", backend="fa2")
        self.spec_verify = BatchPrefillWithPagedKVCacheWrapper(self.fa2_workspace, "NHD", backend="fa2")

        max_bs = max(cfg.graph_buckets)
        max_idx = max_bs * cfg.max_pages_per_req
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_idx, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_idx, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # verify indptr on the device: the draft-append kernel extends it in place
        self.kv_indptr_gpu = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.static_heal_pos = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_loc = torch.zeros(max_bs * (cfg.spec_k + 1), dtype=torch.int64, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None
        self._verify_key: Optional[Tuple[int, int, int]] = None

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_q_heads, num_kv_heads=c.num_kv_heads, page_size=c.page_size)

    def init_decode_graph_buffers(self) -> None:
        self.graph_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.graph_buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )

    # ------------------------------------------------------------ replay prep
    def stage_decode(self, bs: int, n: int, layout: PageLayout, positions: torch.Tensor) -> None:
        nnz = layout.nnz
        self.kv_indptr_cpu[: n + 1].copy_(torch.from_numpy(layout.indptr))
        self.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        self.kv_indices_cpu[:nnz].copy_(torch.from_numpy(layout.indices))
        self.last_page_len_cpu[:n].copy_(torch.from_numpy(layout.last_page_len))
        self.graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)
        self.graph_last_page_len[:n].copy_(self.last_page_len_cpu[:n], non_blocking=True)
        self.static_heal_pos = positions.clone()  # expect: FC107
        self.graph_decode[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices_cpu[:nnz],
            self.last_page_len_cpu[:bs],
            head_dim=self.cfg.head_dim,
            q_data_type=self.cfg.dtype,
            **self._heads(),
        )
        self.graph_bs = bs

    # ----------------------------------------------------------- eager plans
    def plan_eager_decode(self, layout: PageLayout) -> None:
        self.graph_bs = None
        self.eager_decode.plan(  # ok: FC102
            torch.from_numpy(layout.indptr),
            torch.from_numpy(layout.indices).to(self.device, non_blocking=True),
            torch.from_numpy(layout.last_page_len),
            head_dim=self.cfg.head_dim,
            q_data_type=self.cfg.dtype,
            **self._heads(),
        )

    def plan_heal(self, tail_lens: torch.Tensor, layout: PageLayout) -> None:
        n = tail_lens.shape[0]
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(tail_lens, 0, out=qo_indptr[1:])
        self.heal_prefill.plan(  # expect: FC102
            qo_indptr,
            torch.from_numpy(layout.indptr),
            torch.from_numpy(layout.indices).to(self.device, non_blocking=True),
            torch.from_numpy(layout.last_page_len),
            head_dim_qk=self.cfg.head_dim,
            causal=True,
            q_data_type=self.cfg.dtype,
            **self._heads(),
        )

    def plan_verify(self, n: int, k: int, layout: PageLayout) -> None:
        key = (n, k, layout.nnz)
        if self.spec_verify._plan_info is not None and key == self._verify_key:  # expect: FC103
            return
        self._verify_key = key
        qo_indptr_cpu = torch.arange(0, (n + 1) * (k + 1), k + 1, dtype=torch.int32)
        self.kv_indptr_gpu[: n + 1].copy_(torch.from_numpy(layout.indptr), non_blocking=True)
        self.spec_verify.plan(  # expect: FC102
            **dict(
                qo_indptr=qo_indptr_cpu,
                paged_kv_indptr=self.kv_indptr_gpu[: n + 1],
                paged_kv_indices=torch.from_numpy(layout.indices).to(self.device, non_blocking=True),
                paged_kv_last_page_len=torch.from_numpy(layout.last_page_len),
                num_qo_heads=self.cfg.num_q_heads,
                num_kv_heads=self.cfg.num_kv_heads,
                head_dim_qk=self.cfg.head_dim,
                page_size=self.cfg.page_size,
                causal=True,
            )
        )

    # --------------------------------------------------------------- kernels
    def append_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[0]
        ps = self.cfg.page_size
        loc = self.out_loc[:n]
        cache = self.kv[layer_id]
        cache[loc // ps, 0, loc % ps] = k
        cache[loc // ps, 1, loc % ps] = v

    def decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.graph_bs is not None:
            w = self.graph_decode[self.graph_bs]
        else:
            w = self.eager_decode
        return w.run(q, self.kv[layer_id])  # ok: FC108

    def verify(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.spec_verify.run(q, self.kv[layer_id])  # expect: FC108

    def heal(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.heal_prefill.run(q, self.kv[layer_id])

    def decode_trtllm(
        self, q: torch.Tensor, layer_id: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, self.kv[layer_id], self.trt_workspace, block_tables, seq_lens, max_len,
            bmm1_scale=self.cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )

    def host_indptr(self, bs: int) -> np.ndarray:
        return self.kv_indptr_cpu[: bs + 1].numpy()
