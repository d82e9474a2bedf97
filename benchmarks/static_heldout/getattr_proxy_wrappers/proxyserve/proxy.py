"""Proxies around FlashInfer wrappers: every attribute is forwarded, plan/run calls are counted."""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

_COUNTED = frozenset({"plan", "run", "run_return_lse"})


class TracedWrapper:  # stands in for a FlashInfer wrapper wherever the engine holds one
    def __init__(self, inner: Any, name: str):
        assert callable(getattr(inner, "plan", None)), f"{name}: not an attention wrapper"  # expect: FC109
        self._inner = inner  # ok: FC103
        self.name = name
        self.calls: Counter = Counter()

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)  # ok: FC103
        return self._counted(attr, value) if attr in _COUNTED else value

    def _counted(self, attr: str, fn):
        def call(*args, **kwargs):
            self.calls[attr] += 1
            out = fn(*args, **kwargs)
            if attr == "run" and out.isnan().any():  # expect: FC101
                raise FloatingPointError(f"{self.name}: NaN in the attention output")
            return out
        return call

    def is_compiled(self) -> bool:
        return getattr(self._inner, "_cached_module", None) is not None  # expect: FC103


class Fp8KvShim(TracedWrapper):
    """FP8 KV cache layers: plans with an fp8 KV dtype, folds the K scale into sm_scale, hands V's to run()."""

    def __init__(self, inner: Any, name: str, k_scale: torch.Tensor, head_dim: int, max_tokens: int):
        super().__init__(inner, name)
        assert k_scale.dtype == torch.float32, "the KV scales must be fp32"  # expect: FC109
        self.k_scale, self.v_scale, self.head_dim = k_scale, k_scale.clone(), head_dim
        self.dequant_workspace = torch.zeros(max_tokens * 1024, dtype=torch.uint8, device=k_scale.device)  # ok: FC106

    def plan(self, *args, **kwargs):
        if self._inner._kv_layout != "NHD":  # expect: FC103
            raise ValueError("fp8 KV pages must use the NHD layout")
        sm_scale = self.head_dim ** -0.5 * float(self.k_scale)  # expect: FC101
        return self._inner.plan(*args, kv_data_type=torch.float8_e4m3fn, sm_scale=sm_scale, **kwargs)

    def run(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self._inner.run(q, kv_cache, v_scale=self.v_scale)  # expect: FC108
