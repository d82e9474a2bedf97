"""Per-layer attention: an ``nn.Module`` the compiler sees (it only calls the custom op) and a
plain implementation object the op dispatches to."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache
from torch import nn

from coattn.config import CompileServeConfig
from coattn.ops import unified_attention, unified_decode_attention
from coattn.compat import get_trtllm_workspace, get_window_workspace

if TYPE_CHECKING:
    from coattn_exec.metadata import AttnMetadata


class AttentionImplBase(abc.ABC):
    @abc.abstractmethod
    def forward_mixed(self, query, key, value, output, meta) -> None: ...

    @abc.abstractmethod
    def forward_decode(self, query, key, value, output, meta) -> None: ...


class FlashInferImpl(AttentionImplBase):
    def __init__(
        self,
        layer_name: str,
        cfg: CompileServeConfig,
        kv_cache: torch.Tensor,
        sliding_window: Optional[int],
    ):
        self.layer_name = layer_name
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.page_size = cfg.page_size
        self._sm_scale = cfg.head_dim ** -0.5
        self.kv_cache = kv_cache  # [num_pages, 2, num_kv_heads, page_size, head_dim] (HND)
        self.sliding_window = sliding_window
        self.use_trtllm_decode = cfg.use_trtllm_decode
        self.trtllm_ws_bytes = cfg.trtllm_workspace_bytes()
        self.window_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        if sliding_window is not None:
            # window layers keep their own decode wrapper, planned by the ForwardPlanner with
            # window_left; trtllm-gen handles the window natively
            ws = get_window_workspace(cfg.window_workspace_bytes(), kv_cache.device.index)
            self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "HND", backend="trtllm-gen")

    def _write_kv(self, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        page = torch.div(slot_mapping, self.page_size, rounding_mode="floor")
        off = slot_mapping % self.page_size
        self.kv_cache[page, 0, :, off] = key
        self.kv_cache[page, 1, :, off] = value

    def _decode_rows(self, q: torch.Tensor, out: torch.Tensor, meta: "AttnMetadata") -> None:
        nd = q.shape[0]
        if self.use_trtllm_decode and self.sliding_window is None:
            out.copy_(
                trtllm_batch_decode_with_kv_cache(
                    q,
                    self.kv_cache,
                    get_trtllm_workspace(self.trtllm_ws_bytes, self.kv_cache.device.index),
                    meta.block_table[:nd],
                    meta.seq_lens[:nd],
                    meta.max_decode_seq_len,
                    self._sm_scale,
                    1.0,
                )
            )
        elif self.window_wrapper is not None and meta.needs_window_mask:
            self.window_wrapper.run(q, self.kv_cache, out=out)  # expect: FC108
        else:
            meta.decode_wrapper.run(q, self.kv_cache, out=out)  # ok: FC108

    def forward_mixed(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output: torch.Tensor,
        meta: Optional["AttnMetadata"],
    ) -> None:
        if meta is None:  # memory profiling run
            return
        out = output[: meta.num_actual_tokens]  # ok: FC101
        n = meta.num_actual_tokens
        self._write_kv(key[:n], value[:n], meta.slot_mapping[:n])
        nd = meta.num_decode_tokens
        if nd:
            self._decode_rows(query[:nd], out[:nd], meta)
        if meta.num_prefills:
            # the prefill queries end where the last request's queries end
            prefill_end = int(meta.query_start_loc[-1])  # expect: FC101
            meta.prefill_wrapper.run(query[nd:prefill_end], self.kv_cache, out=out[nd:prefill_end])

    def forward_decode(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        output: torch.Tensor,
        meta: Optional["AttnMetadata"],
    ) -> None:
        n = query.shape[0]
        self._write_kv(key, value, meta.slot_mapping[:n])
        self._decode_rows(query, output, meta)


class Attention(nn.Module):
    """What the compiled model calls: one custom op per layer, the layer name as the key."""

    def __init__(self, layer_name: str, num_heads: int, head_dim: int):
        super().__init__()
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.head_dim = head_dim

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        unified_attention(q, k, v, out, self.layer_name)
        return out

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        unified_decode_attention(q, k, v, out, self.layer_name)
        return out
