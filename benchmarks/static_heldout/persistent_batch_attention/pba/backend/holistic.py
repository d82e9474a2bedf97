"""Persistent holistic attention per step, classic paged wrappers as fallback, decode graphs."""

import os
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchAttention,
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
)

from pba.batch_info import MixedBatchInfo
from pba.config import EngineConfig

_GRAPH_WS_BYTES = int(os.environ.get("PBA_GRAPH_WORKSPACE_BYTES", 256 << 20))


class HolisticAttnBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_batch = cfg.max_batch_size
        self.holistic = BatchAttention(kv_layout="NHD")
        self.tail_attn = BatchAttention(kv_layout="NHD")
        decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        split_bytes = cfg.num_qo_heads * (cfg.head_dim + 1) * 4
        fb_decode_bytes = cfg.max_batch_size * cfg.max_splits * split_bytes
        self.fallback_decode_ws = torch.empty(fb_decode_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.fallback_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.fallback_decode_ws, "NHD", use_tensor_cores=True, backend=decode_backend
        )
        fb_prefill_bytes = 2 * cfg.max_num_tokens * split_bytes + cfg.max_batch_size * split_bytes
        self.fallback_prefill_ws = torch.empty(fb_prefill_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.fallback_prefill = BatchPrefillWithPagedKVCacheWrapper(self.fallback_prefill_ws, "NHD", backend="fa2")
        self.swa_decode = BatchDecodeWithPagedKVCacheWrapper(self.fallback_prefill_ws, "NHD", backend="fa2")
        self._plan_prefill = self.fallback_prefill.plan
        self._plan_info: Optional[tuple] = None  # ok: FC103
        self._kv_layout = "NHD"
        self.graph_workspace = torch.zeros(_GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.lse_scratch: Optional[torch.Tensor] = None

    # ---- graph buffers -----------------------------------------------------

    def init_graph_buffers(self, max_bs: int) -> None:
        cfg = self.cfg
        self.graph_kv_indptr = torch.empty(max_bs + 1, dtype=torch.int32, device=self.device)
        self.graph_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=self.device)
        self.graph_kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_kv_indptr.zero_()  # ok: FC104
        self.graph_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.graph_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def bind_graph_wrapper(self, bs: int) -> None:
        cfg = self.cfg
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.graph_kv_indices,
            paged_kv_last_page_len_buffer=self.graph_kv_last_page_len[:bs],
            backend="fa2",
        )
        self.graph_kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        w.plan(
            self.graph_kv_indptr_cpu[: bs + 1],
            self.graph_kv_indices[:bs],
            self.graph_last_page_len_cpu[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self._plan_swa(self.graph_kv_indptr_cpu[: bs + 1], self.graph_kv_indices[:bs], self.graph_last_page_len_cpu[:bs])
        self.graph_decode[bs] = w

    def _plan_swa(self, indptr_cpu: torch.Tensor, indices: torch.Tensor, last_page_len_cpu: torch.Tensor) -> None:
        cfg = self.cfg
        self.swa_decode.plan(
            indptr_cpu,
            indices,
            last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            window_left=cfg.sliding_window - 1,
            data_type=torch.bfloat16,
        )

    # ---- per step ----------------------------------------------------------

    def plan_mixed(self, info: MixedBatchInfo) -> None:
        assert info.num_reqs <= self.max_batch  # expect: FC109
        cfg = self.cfg
        self._plan_info = (info.num_reqs, info.num_decode)
        self.holistic.plan(  # ok: FC102
            qo_indptr=info.qo_indptr_cpu,
            kv_indptr=info.kv_indptr_cpu,
            kv_indices=info.kv_indices,
            kv_len_arr=info.kv_lens_cpu,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            head_dim_vo=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )

    def plan_chunked_tail(self, tail: MixedBatchInfo) -> None:
        cfg = self.cfg
        self.tail_attn.plan(  # expect: FC102
            qo_indptr=tail.qo_indptr_cpu,
            kv_indptr=tail.kv_indptr_cpu,
            kv_indices=tail.kv_indices,
            kv_len_arr=tail.kv_lens,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            head_dim_vo=cfg.head_dim,
            page_size=cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )

    def plan_fallback(self, info: MixedBatchInfo) -> None:
        cfg = self.cfg
        if info.decode_only:
            self.fallback_decode.plan(
                info.kv_indptr_cpu,
                info.kv_indices,
                info.last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                data_type=torch.bfloat16,
            )
            return
        chunked = info.max_q_len > cfg.prefill_chunk
        self._plan_prefill(  # expect: FC102
            info.qo_indptr,
            info.kv_indptr_cpu,
            info.kv_indices,
            info.last_page_len_cpu,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
            disable_split_kv=chunked,
        )

    def prepare_graph_inputs(self, info: MixedBatchInfo, padded_bs: int) -> None:
        cfg = self.cfg
        bs = info.num_reqs
        n = int(info.kv_indptr_cpu[bs])
        self.graph_kv_indptr[: bs + 1].copy_(info.kv_indptr[: bs + 1])  # ok: FC104
        self.graph_kv_indices[:n].copy_(info.kv_indices[:n])  # ok: FC104
        self.graph_kv_indptr_cpu[: bs + 1] = info.kv_indptr_cpu[: bs + 1]
        self.graph_kv_indptr_cpu[bs + 1 : padded_bs + 1] = n
        self.graph_last_page_len_cpu[:bs] = info.last_page_len_cpu[:bs]
        self.graph_last_page_len_cpu[bs:padded_bs] = 1
        if self.lse_scratch is None:
            self.lse_scratch = torch.empty(cfg.max_batch_size, cfg.num_qo_heads, dtype=torch.float32, device=self.device)  # ok: FC107
        self.graph_decode[padded_bs].plan(  # ok: FC102
            self.graph_kv_indptr_cpu[: padded_bs + 1],
            self.graph_kv_indices,
            self.graph_last_page_len_cpu[:padded_bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self._plan_swa(self.graph_kv_indptr_cpu[: padded_bs + 1], self.graph_kv_indices, self.graph_last_page_len_cpu[:padded_bs])

    # ---- attention ---------------------------------------------------------

    def forward_decode(self, sliding: bool, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if sliding:
            return self.swa_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_decode[bs] if bs in self.graph_decode else self.fallback_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_mixed(self, q: torch.Tensor, kv_cache: torch.Tensor, tail_q: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.cfg.use_holistic:
            out, _ = self.holistic.run(q, kv_cache)
        else:
            out = self.fallback_prefill.run(q, kv_cache)
        if tail_q is not None:
            tail_out, _ = self.tail_attn.run(tail_q, kv_cache)
            out = torch.cat([out, tail_out], dim=0)
        return out
