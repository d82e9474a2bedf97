"""``BatchAttention`` (the persistent "holistic" kernel), eager: it owns its workspaces and its plan synchronizes
unconditionally, so engines do not capture it.
"""

from __future__ import annotations

from typing import Any

from flashcheck.batch import BatchSpec
from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.base import FlashInferTargetBase
from flashcheck.targets.flashinfer.prefill import default_prefill_template

__all__ = ["BatchAttentionTarget"]


class BatchAttentionTarget(FlashInferTargetBase):
    kind = "batch_attention"

    def __init__(self, template: BatchSpec | None = None, *, max_qo_len: int = 64, **kwargs: Any) -> None:
        tpl = template or default_prefill_template(dtype="bfloat16")
        super().__init__(tpl, buckets=(), max_qo_len=max_qo_len, metadata="device", **kwargs)
        self.name = "batch-attention"

    def _make_eager(self) -> Any:
        return self.fi.mod.BatchAttention(kv_layout="NHD", device=self.env.device)

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        t = self.capacity.template
        m = self.meta(layout.padded_batch_size)
        wrapper.plan(
            m["qo_indptr"],
            m["kv_indptr"],
            self.kv_indices_gpu[:tot],
            m["kv_len"],
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim_qk,
            t.head_dim_vo,
            t.page_size,
            causal=t.causal,
            sm_scale=t.scale,
            logits_soft_cap=t.logits_soft_cap or None,
            q_data_type=getattr(self.torch, t.q_dtype),
            kv_data_type=getattr(self.torch, t.kv_dtype),
        )

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        o, _lse = wrapper.run(q, (self.env.k_cache, self.env.v_cache))
        return o
