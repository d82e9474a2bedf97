"""MLA target: ``BatchMLAPagedAttentionWrapper`` (fa2/fa3), eager and per-bucket CUDA graphs (SGLang's DeepSeek
decode path), with the absorbed layout: ckv [pages, page, 512] and kpe [pages, page, 64].
"""

from __future__ import annotations

from typing import Any

from flashcheck.batch import BatchSpec
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.base import FlashInferTargetBase

__all__ = ["MLATarget", "default_mla_template"]

CKV, KPE = 512, 64


def default_mla_template(page_size: int = 1, heads: int = 16) -> BatchSpec:
    """DeepSeek-V3 at TP8: 16 heads, ckv 512 + kpe 64, bf16."""
    return BatchSpec(
        (1,),
        (1,),
        page_size=page_size,
        num_qo_heads=heads,
        num_kv_heads=1,
        head_dim_qk=CKV + KPE,
        head_dim_vo=CKV,
        q_dtype="bfloat16",
        kv_dtype="bfloat16",
        causal=True,
    )


class MLATarget(FlashInferTargetBase):
    """The driver's KV cache is [P, page, 1, 576] = ckv ++ kpe; the target splits it into the two caches."""

    kind = "mla"

    def __init__(
        self, template: BatchSpec | None = None, *, backend: str = "fa2", max_qo_len: int = 1, **kwargs: Any
    ) -> None:
        if backend not in ("fa2", "fa3", "auto"):
            raise InvalidArgument(f"backend must be 'fa2', 'fa3' or 'auto', got {backend!r}")
        tpl = template or default_mla_template()
        if (tpl.head_dim_qk, tpl.head_dim_vo, tpl.num_kv_heads) != (CKV + KPE, CKV, 1):
            raise InvalidArgument("MLA templates need head_dim_qk=576, head_dim_vo=512, num_kv_heads=1")
        kwargs.setdefault("max_pages", 65536)
        kwargs["value_from_key"] = True
        super().__init__(tpl, max_qo_len=max_qo_len, **kwargs)
        self.backend = backend
        self.name = f"mla-{backend}"

    def _extra_config(self) -> dict[str, Any]:
        return {"backend": self.backend}

    def setup(self, env: Any) -> None:
        super().setup(env)
        k = env.k_cache  # [P, page, 1, 576]; the driver's v_cache is its first 512 columns
        self.ckv = k[:, :, 0, :CKV].contiguous()
        self.kpe = k[:, :, 0, CKV:].contiguous()

    def _make_eager(self) -> Any:
        return self.fi.mod.mla.BatchMLAPagedAttentionWrapper(self.float_ws, backend=self.backend)

    def _make_graph_wrapper(self, bucket: int) -> Any:
        return self.fi.mod.mla.BatchMLAPagedAttentionWrapper(
            self._float_ws_for(f"graph bs={bucket}"),
            use_cuda_graph=True,
            qo_indptr=self.qo_indptr_gpu[: bucket + 1],
            kv_indptr=self.kv_indptr_gpu[: bucket + 1],
            kv_indices=self.kv_indices_gpu,
            kv_len_arr=self.kv_len_gpu[:bucket],
            backend=self.backend,
        )

    def _graph_reads_qo_indptr(self) -> bool:
        return True

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        t = self.capacity.template
        m = self.meta(layout.padded_batch_size)
        wrapper.plan(
            qo_indptr=m["qo_indptr"],
            kv_indptr=m["kv_indptr"],
            kv_indices=self.kv_indices_gpu[:tot],
            kv_len_arr=m["kv_len"],
            num_heads=t.num_qo_heads,
            head_dim_ckv=CKV,
            head_dim_kpe=KPE,
            page_size=t.page_size,
            causal=t.causal,
            sm_scale=t.scale,
            q_data_type=getattr(self.torch, t.q_dtype),
            kv_data_type=getattr(self.torch, t.kv_dtype),
        )

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        q_nope = q[..., :CKV].contiguous()
        q_pe = q[..., CKV:].contiguous()
        return wrapper.run(q_nope=q_nope, q_pe=q_pe, ckv_cache=self.ckv, kpe_cache=self.kpe)
