"""Eager FlashInfer backend: the bottom of every backend stack."""

from __future__ import annotations

from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from mroserve.batch import ForwardBatch
from mroserve_attn.base import AttentionBackend


class FlashInferBackend(AttentionBackend, register="flashinfer"):
    """Paged decode and prefill through FA2 wrappers, one per distinct ``window_left``.

    Planned once per step from the batch's pinned mirrors. Mixins listed before
    this class in a concrete backend decide whether these wrappers run at all.
    """

    decode_backend = "fa2"

    def __init__(self, cfg, device, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        self.workspace = torch.empty(cfg.workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105, FC106
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            wl: BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2") for wl in cfg.window_lefts()
        }
        self.prefill_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {
            wl: BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD", backend="fa2") for wl in cfg.window_lefts()
        }

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        if fb.forward_mode.is_decode():
            for wl, wrapper in self.decode_wrappers.items():
                wrapper.plan(  # ok: FC102
                    fb.kv_indptr_cpu,
                    fb.kv_indices,
                    fb.kv_last_page_len_cpu,
                    cfg.num_qo_heads,
                    cfg.num_kv_heads,
                    cfg.head_dim,
                    cfg.page_size,
                    window_left=wl,
                    q_data_type=cfg.dtype,
                )
            return
        for wl, wrapper in self.prefill_wrappers.items():
            wrapper.plan(
                fb.qo_indptr_cpu,
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.kv_last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                window_left=wl,
                q_data_type=cfg.dtype,
            )

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        wrapper = self.decode_wrappers[layer.window_left]
        return wrapper.run(q, self.kv_caches[layer.layer_id])  # ok: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        wrapper = self.prefill_wrappers[layer.window_left]
        return wrapper.run(q, self.kv_caches[layer.layer_id])  # ok: FC108
