"""FlashInfer FA2 wrappers, each built the first time a step needs it."""
from __future__ import annotations

from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from fb_backends.base import AttentionBackendBase, StepInputs
from fbchain.capability import DeviceCaps
from fbchain.config import ChainConfig
from fbchain.registry import register_backend


@register_backend("fa2", priority=1)
class FlashInferFA2Backend(AttentionBackendBase):
    name = "fa2"

    def __init__(self, cfg: ChainConfig, caps: DeviceCaps, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._fa2_ws = torch.empty(cfg.fa2_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self._wrappers: Dict[str, object] = {}
        self.resolved_prefill_backend: Optional[str] = None

    @classmethod
    def supports(cls, caps: DeviceCaps, dtype: torch.dtype, head_dim: int) -> bool:
        return caps.sm >= 80 and dtype in (torch.float16, torch.bfloat16) and head_dim in (64, 128, 256)

    def _lazy(self, kind: str):
        w = self._wrappers.get(kind)
        if w is not None:
            return w
        if kind == "decode":
            w = BatchDecodeWithPagedKVCacheWrapper(self._fa2_ws, "NHD", use_tensor_cores=True, backend="fa2")
        elif kind == "window":
            w = BatchDecodeWithPagedKVCacheWrapper(self._fa2_ws, "NHD", backend="fa2")
        else:
            w = BatchPrefillWithPagedKVCacheWrapper(self._fa2_ws, "NHD", backend="auto")
        first = next(iter(self._wrappers.values()), None)
        if first is not None:
            # one int workspace (the plan info the kernels read) for every wrapper
            w.reset_workspace_buffer(self._fa2_ws, first._int_workspace_buffer)  # expect: FC103
        self._wrappers[kind] = w
        return w

    def _heads(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, page_size=c.page_size)

    def plan(self, inputs: StepInputs) -> None:
        if inputs.is_decode:
            self.plan_decode(inputs)
        else:
            self.plan_prefill(inputs)

    def plan_decode(self, inputs: StepInputs) -> None:
        cfg = self.cfg
        self._lazy("decode").plan(  # expect: FC102
            inputs.kv_indptr,
            inputs.kv_indices,
            inputs.kv_last_page_len_cpu,
            head_dim=cfg.head_dim,
            q_data_type=cfg.dtype,
            **self._heads(),
        )
        if inputs.window_layers:
            self._lazy("window").plan(
                inputs.kv_indptr_cpu,
                inputs.kv_indices,
                inputs.kv_last_page_len_cpu,
                head_dim=cfg.head_dim,
                window_left=cfg.window - 1,
                q_data_type=cfg.dtype,
                **self._heads(),
            )

    def plan_prefill(self, inputs: StepInputs) -> None:
        w = self._lazy("prefill")
        w.plan(  # ok: FC102
            inputs.qo_indptr_cpu,
            inputs.kv_indptr_cpu,
            inputs.kv_indices,
            inputs.kv_last_page_len_cpu,
            head_dim_qk=self.cfg.head_dim,
            causal=True,
            q_data_type=self.cfg.dtype,
            **self._heads(),
        )
        self.resolved_prefill_backend = w._backend  # expect: FC103

    def forward_decode(self, q, kv, inputs: StepInputs, layer_idx: int, graph_wrapper=None) -> torch.Tensor:
        if layer_idx in inputs.window_layers:
            return self._lazy("window").run(q, kv)  # expect: FC108
        w = graph_wrapper if graph_wrapper is not None else self._lazy("decode")
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q, k, v, kv, inputs: StepInputs, layer_idx: int) -> torch.Tensor:
        return self._lazy("prefill").run(q, kv)
