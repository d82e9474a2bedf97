import logging
from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from kvtiers import Tier, TierConfig, TierTable
from kvtiers.quant import Int4Quantizer, dequantize_fp8, dequantize_int4

from .meta import TierStepMeta
from .workspaces import (fa2_workspace, graph_workspace, int4_workspace, trtllm_decode_workspace,
                         trtllm_prefill_workspace)

logger = logging.getLogger(__name__)

_WS_ATTRS = ("_float_workspace_buffer", "_int_workspace_buffer")


class Int4DecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """Decode over pages dequantised from int4 into a bf16 scratch pool."""

    def scratch_layout(self) -> str:
        return self._kv_layout  # expect: FC103


class TieredAttention:
    def __init__(self, cfg: TierConfig, table: TierTable, device: str):
        self.cfg = cfg
        self.table = table
        self.device = device
        self.quantizer = Int4Quantizer(cfg.int4_group_size)
        fa2_ws = fa2_workspace(cfg, device)
        self.prefill_ws = trtllm_prefill_workspace(cfg, device)
        self.fp8_prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "HND", backend="trtllm-gen")
        self.fp8_k_scale = torch.ones(cfg.num_layers, cfg.num_kv_heads, dtype=torch.float32, device=device)
        self.fp8_decode = BatchDecodeWithPagedKVCacheWrapper(
            trtllm_decode_workspace(cfg.trtllm_prefill_bytes(), device), "HND", backend="trtllm-gen",
        )
        self.int4_decode = Int4DecodeWrapper(int4_workspace(cfg, device), "NHD", use_tensor_cores=True)
        self.eager_bf16 = BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "NHD", use_tensor_cores=True)
        n_bf16 = cfg.pages_per_tier[Tier.BF16]
        self.bf16_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        self.bf16_indices = torch.zeros(n_bf16, dtype=torch.int32, device=device)
        self.bf16_last_page_len = torch.ones(cfg.max_batch, dtype=torch.int32, device=device)
        self.bf16_indptr_cpu = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.bf16_last_page_len_cpu = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.int4_scratch = torch.zeros(
            cfg.max_batch * 64, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device,
        )
        self.graph_ws = graph_workspace(device)
        self.bf16_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_bf16_buffers(self) -> None:
        self.bf16_indptr.zero_()  # ok: FC104
        for bs in self.cfg.graph_buckets:
            self.bf16_graph[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=self.bf16_indptr[: bs + 1],
                paged_kv_indices_buffer=self.bf16_indices,
                paged_kv_last_page_len_buffer=self.bf16_last_page_len[:bs],
            )

    def workspace_bytes_in_use(self) -> int:
        total = 0
        for w in [self.eager_bf16, self.int4_decode, self.fp8_decode]:
            for name in _WS_ATTRS:
                total += getattr(w, name).numel()  # expect: FC103
        logger.info("tier attention workspaces: %d MiB (quantizer %s)", total >> 20, self.quantizer._backend)  # ok: FC103
        return total

    def prepare_tiers(self, meta: TierStepMeta) -> None:
        c = self.cfg
        bs = meta.batch
        padded = meta.graph_bs or bs
        self.bf16_indptr_cpu[: bs + 1].copy_(meta.bf16_indptr_host)
        self.bf16_indptr_cpu[bs + 1 : padded + 1] = self.bf16_indptr_cpu[bs]
        self.bf16_last_page_len_cpu[:bs].copy_(meta.bf16_last_page_len_host)
        self.bf16_indptr[: padded + 1].copy_(self.bf16_indptr_cpu[: padded + 1], non_blocking=True)  # ok: FC104
        n = meta.bf16_indices.shape[0]
        self.bf16_indices[:n].copy_(meta.bf16_indices, non_blocking=True)
        dims = dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)
        if meta.graph_bs is not None:
            self.bf16_graph[padded].plan(  # ok: FC102
                **dict(indptr=self.bf16_indptr_cpu[: padded + 1], indices=self.bf16_indices,
                       last_page_len=self.bf16_last_page_len_cpu[:padded]), **dims,
            )
        else:
            self.eager_bf16.plan(meta.bf16_indptr_host, meta.bf16_indices, meta.bf16_last_page_len_host, **dims)
        bmm1_scale = float(self.fp8_k_scale.max()) * c.head_dim ** -0.5  # expect: FC101
        self.fp8_decode.plan(  # expect: FC102
            meta.fp8_indptr_host, meta.fp8_indices, meta.fp8_last_page_len, **dims,
            data_type=torch.float8_e4m3fn, sm_scale=bmm1_scale,
        )
        if self.table.has_int4:
            n4 = self.table.int4_pages_host
            logger.debug("dequantising %d int4 pages this step", n4)
            self.int4_decode.plan(  # ok: FC102
                meta.int4_indptr_host, meta.int4_indices, meta.int4_last_page_len_host, **dims,
            )
            self.int4_scratch[:n4].zero_()  # ok: FC104
        pad = self.bf16_last_page_len[bs:padded]
        pad.fill_(1)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv: List[torch.Tensor], meta: TierStepMeta) -> torch.Tensor:
        if meta.graph_bs is not None:
            w = self.bf16_graph[meta.graph_bs]
        else:
            w = self.eager_bf16
        o_bf16, lse_bf16 = w.run_return_lse(q, kv[Tier.BF16])
        o_fp8, lse_fp8 = self.fp8_decode.run_return_lse(q, kv[Tier.FP8])  # expect: FC108
        o, lse = merge_state(o_bf16, lse_bf16, o_fp8, lse_fp8)
        if meta.dequant_pages is not None:
            w4 = self.bf16_graph[meta.graph_bs] if meta.graph_bs is not None else self.int4_decode
            o_int4, lse_int4 = w4.run_return_lse(q, meta.dequant_pages)  # ok: FC108
            o, lse = merge_state(o, lse, o_int4, lse_int4)
        return o

    def dequantize_old_tiers(self, packed: torch.Tensor, scales: torch.Tensor, fp8_pages: torch.Tensor,
                             fp8_scale: torch.Tensor) -> torch.Tensor:
        bf = dequantize_int4(packed, scales, self.cfg.int4_group_size)
        return torch.cat([dequantize_fp8(fp8_pages, fp8_scale), bf], dim=0)
