"""Prefill targets: paged (``BatchPrefillWithPagedKVCacheWrapper``) and ragged
(``BatchPrefillWithRaggedKVCacheWrapper``) with the fa2 or fa3 backend, eager like vLLM's prefill path, and paged
in CUDA-graph mode like SGLang's speculative target-verify graphs (fixed query rows per request).
"""

from __future__ import annotations

from typing import Any, Literal

from flashcheck.batch import BatchSpec, DType
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.base import FlashInferTargetBase, GraphSlot, llama_template

__all__ = ["PagedPrefillTarget", "RaggedPrefillTarget", "default_prefill_template"]

Backend = Literal["fa2", "fa3", "auto"]


def default_prefill_template(page_size: int = 16, dtype: DType = "float16", causal: bool = True) -> BatchSpec:
    return llama_template(page_size, dtype, causal)


def _check_backend(backend: str) -> None:
    if backend not in ("fa2", "fa3", "auto"):
        raise InvalidArgument(f"backend must be 'fa2', 'fa3' or 'auto', got {backend!r}")


class PagedPrefillTarget(FlashInferTargetBase):
    """Paged prefill. Graph buckets (optional) model SGLang target-verify: ``max_qo_len`` rows per request."""

    kind = "prefill"

    def __init__(
        self,
        template: BatchSpec | None = None,
        *,
        backend: Backend = "fa2",
        max_qo_len: int = 64,
        buckets: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> None:
        _check_backend(backend)
        tpl = template or default_prefill_template()
        if buckets:
            kwargs.setdefault("padding", "vllm_legacy")
        super().__init__(
            tpl,
            buckets=buckets,
            max_qo_len=max_qo_len,
            max_total_qo=kwargs.pop("max_total_qo", max(buckets or (32,)) * max_qo_len),
            **kwargs,
        )
        self.backend = backend
        self.name = f"prefill-{backend}"

    def _extra_config(self) -> dict[str, Any]:
        return {"backend": self.backend}

    def _make_eager(self) -> Any:
        return self.fi.mod.BatchPrefillWithPagedKVCacheWrapper(self.float_ws, "NHD", backend=self.backend)

    def _make_graph_wrapper(self, bucket: int) -> Any:
        return self.fi.mod.BatchPrefillWithPagedKVCacheWrapper(
            self._float_ws_for(f"graph bs={bucket}"),
            "NHD",
            use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr_gpu[: bucket + 1],
            paged_kv_indptr_buf=self.kv_indptr_gpu[: bucket + 1],
            paged_kv_indices_buf=self.kv_indices_gpu,
            paged_kv_last_page_len_buf=self.last_gpu[:bucket],
            backend=self.backend,
        )

    def _graph_reads_qo_indptr(self) -> bool:
        return True

    def _capture_plan(self, slot: GraphSlot, bucket: int, layout: PagedLayout) -> None:
        # FlashInfer fixes a graph's query rows at the first plan (sticky max_total_num_rows) and run() requires
        # q.shape[0] == qo_indptr[-1]: capture at the bucket's fixed row count (SGLang's verify graphs use
        # bs * num_draft_tokens rows); replays re-plan with the real rows and read only those.
        from flashcheck.layout import build_paged_layout

        mq = self.capacity.max_qo_len
        spec = layout.spec.with_lengths((mq,) * bucket, (mq,) * bucket)
        biggest = build_paged_layout(spec, num_pages=self.capacity.max_pages)
        self._plan(slot.wrapper, biggest, self.fill_metadata(biggest), graph=True)

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        t = self.capacity.template
        wrapper.plan(
            self.meta(layout.padded_batch_size)["qo_indptr"],
            *self._paged_plan_args(layout, tot),
            head_dim_vo=t.head_dim_vo,
            causal=t.causal,
            pos_encoding_mode="NONE",
            **self._common_kw(),
        )

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        return wrapper.run(q, (self.env.k_cache, self.env.v_cache))


class RaggedPrefillTarget(FlashInferTargetBase):
    """Ragged prefill over contiguous K/V rows (the new tokens of each request), eager only."""

    kind = "ragged"

    def __init__(
        self, template: BatchSpec | None = None, *, backend: Backend = "fa2", max_qo_len: int = 64, **kwargs: Any
    ) -> None:
        _check_backend(backend)
        tpl = template or default_prefill_template(page_size=1)
        if tpl.page_size != 1:
            raise InvalidArgument("ragged targets use page_size 1 (one row per token)")
        super().__init__(tpl, buckets=(), max_qo_len=max_qo_len, paged=False, **kwargs)
        self.backend = backend
        self.name = f"ragged-{backend}"

    def _extra_config(self) -> dict[str, Any]:
        return {"backend": self.backend}

    def _make_eager(self) -> Any:
        return self.fi.mod.BatchPrefillWithRaggedKVCacheWrapper(self.float_ws, "NHD", backend=self.backend)

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        t = self.capacity.template
        m = self.meta(layout.padded_batch_size)
        self._rows = self.kv_indices_gpu[:tot].long()
        wrapper.plan(
            m["qo_indptr"],
            m["kv_indptr"],
            t.num_qo_heads,
            t.num_kv_heads,
            t.head_dim_qk,
            head_dim_vo=t.head_dim_vo,
            causal=t.causal,
            pos_encoding_mode="NONE",
            **self._common_kw(),
        )

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        # the engine's K/V of the new tokens: gathered rows (page size 1, contiguous allocation)
        k = self.env.k_cache[self._rows, 0]
        v = self.env.v_cache[self._rows, 0]
        return wrapper.run(q, k, v)
