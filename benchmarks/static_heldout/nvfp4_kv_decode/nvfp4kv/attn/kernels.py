"""Decode kernels over the quantized pool: XQA (NVFP4), trtllm-gen (FP8), FlashInfer wrappers (FP8)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache

from nvfp4kv.attn.workspaces import dequant_workspace, trtllm_workspace, wrapper_workspace, xqa_workspace
from nvfp4kv.limits import QuantLimits
from nvfp4kv.quant.kv_pool import QuantKVPool

if TYPE_CHECKING:
    from nvfp4kv.attn.backend import QuantDecodeBackend


@dataclasses.dataclass
class DecodeMeta:
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int
    kv_indices: torch.Tensor
    write_loc: torch.Tensor
    num_pages: int
    graph_bs: int


class QuantDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FA2 decode over pages dequantized to bf16 (FP8 with per-page scales)."""

    def plan_dequant(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size) -> None:
        if self._kv_layout != "NHD":  # expect: FC103
            raise ValueError("dequantized pages are written NHD")
        self.plan(  # ok: FC102
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )


def _wrapper_kwargs(sm: int, prefer_wrappers: bool) -> dict:
    kw = {"use_tensor_cores": True}
    if sm >= 100 and prefer_wrappers:
        kw["backend"] = "trtllm-gen"
    return kw


class XqaNvfp4Decode:
    def __init__(self, limits: QuantLimits, pool: QuantKVPool, device: torch.device):
        self.pool = pool
        self.ws = xqa_workspace(limits, device)
        self.sm_scale = limits.head_dim**-0.5

    def decode(self, q: torch.Tensor, layer: int, md: DecodeMeta) -> torch.Tensor:
        bmm1 = self.sm_scale * float(self.pool.kv_global_scale[0, layer])  # expect: FC101
        data, sf = self.pool.kv_data[layer], self.pool.kv_block_sf[layer]
        return xqa_batch_decode_with_kv_cache(
            q, (data[:, 0], data[:, 1]), self.ws, md.block_tables, md.seq_lens, md.max_seq_len,
            bmm1_scale=bmm1, bmm2_scale=self.pool.kv_global_scale[1, layer], kv_layout="NHD",
            kv_cache_sf=(sf[:, 0], sf[:, 1]),
        )


class TrtllmFp8Decode:
    def __init__(self, limits: QuantLimits, pool: QuantKVPool, device: torch.device):
        self.pool = pool
        self.ws = trtllm_workspace("trtllm-gen", device)
        self.sm_scale = limits.head_dim**-0.5

    def decode(self, q: torch.Tensor, layer: int, md: DecodeMeta) -> torch.Tensor:
        scale = self.pool.kv_global_scale
        return trtllm_batch_decode_with_kv_cache(
            q, self.pool.kv_data[layer], self.ws, md.block_tables, md.seq_lens, md.max_seq_len,
            bmm1_scale=self.sm_scale * scale[0, layer], bmm2_scale=scale[1, layer], kv_layout="HND",
        )


class WrapperFp8Decode:
    def __init__(self, limits: QuantLimits, pool: QuantKVPool, bufs: "QuantDecodeBackend", device: torch.device, sm: int):
        self.limits = limits
        self.pool = pool
        self.sm_scale = limits.head_dim**-0.5
        self.ws = wrapper_workspace(limits, device)
        kw = _wrapper_kwargs(sm, limits.prefer_wrappers)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in limits.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=bufs.kv_indices,
                paged_kv_last_page_len_buffer=bufs.last_page_len[:bs],
                **kw,
            )
        self.block_scaled = limits.fp8_block_scaled
        self.dequant_wrapper = QuantDecodeWrapper(dequant_workspace(limits, device), "NHD", backend="fa2")
        scratch_pages = limits.max_batch_size * 64
        self.bf16_pages = torch.zeros(
            scratch_pages, 2, limits.page_size, limits.num_kv_heads, limits.head_dim,
            dtype=torch.bfloat16, device=device,
        )

    def fold_k_scale(self, k_scale: float) -> None:
        """FP8 path: one K scale for the whole model, folded into every plan's softmax scale."""
        for bs, w in self.graph_wrappers.items():
            setattr(w, "_sm_scale", self.sm_scale * k_scale)  # expect: FC103

    def decode(self, q: torch.Tensor, layer: int, md: DecodeMeta) -> torch.Tensor:
        if self.block_scaled:
            kv = self.pool.dequantize_pages(layer, md.kv_indices[: md.num_pages].long(), self.bf16_pages)
            return self.dequant_wrapper.run(q, kv)  # expect: FC108
        out = self.graph_wrappers[md.graph_bs].run(q, self.pool.kv_data[layer])  # ok: FC108
        return out * self.pool.kv_global_scale[1, layer]
