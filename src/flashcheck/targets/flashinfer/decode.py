"""Decode targets: ``BatchDecodeWithPagedKVCacheWrapper`` driven the way vLLM (full CUDA graphs per padded batch
size, host metadata, ``fast_decode_plan`` before replay) and SGLang (page size 1, seq_len-1 padding) drive it.
"""

from __future__ import annotations

from typing import Any

from flashcheck.batch import BatchSpec, DType
from flashcheck.errors import InvalidArgument
from flashcheck.layout import PagedLayout
from flashcheck.targets.flashinfer.base import FlashInferTargetBase, GraphSlot, Replan, llama_template

__all__ = ["DecodeTarget", "default_decode_template"]


def default_decode_template(page_size: int = 16, dtype: DType = "float16") -> BatchSpec:
    """Llama-3-8B-like decode heads (32 query, 8 KV, dim 128)."""
    return llama_template(page_size, dtype, causal=False)


class DecodeTarget(FlashInferTargetBase):
    """Paged decode, CUDA-core (``use_tensor_cores=False``) or tensor-core, eager and per-bucket CUDA graphs.

    Args:
        use_tensor_cores: vLLM's default is True; SGLang decides by GQA group size.
        replan: ``full`` (``wrapper.plan`` with host tensors before each replay) or ``fast``
            (``flashinfer.fast_decode_plan`` after the persistent buffers were written, as vLLM and SGLang do).
        metadata: ``host`` (pinned CPU indptr/last_page_len, 0 syncs) or ``device`` (device tensors: FlashInfer
            copies them to the host on every plan).
    """

    kind = "decode"

    def __init__(
        self,
        template: BatchSpec | None = None,
        *,
        use_tensor_cores: bool = False,
        replan: Replan = "fast",
        **kwargs: Any,
    ) -> None:
        tpl = template or default_decode_template()
        if replan not in ("full", "fast"):
            raise InvalidArgument(f"replan must be 'full' or 'fast', got {replan!r}")
        super().__init__(tpl, max_qo_len=1, **kwargs)
        self.use_tensor_cores = use_tensor_cores
        self.replan: Replan = replan
        self.name = f"decode-{'tc' if use_tensor_cores else 'cuda'}"

    def _extra_config(self) -> dict[str, Any]:
        return {"use_tensor_cores": self.use_tensor_cores, "replan": self.replan}

    def _make_eager(self) -> Any:
        return self.fi.mod.BatchDecodeWithPagedKVCacheWrapper(
            self.float_ws, "NHD", use_tensor_cores=self.use_tensor_cores
        )

    def _make_graph_wrapper(self, bucket: int) -> Any:
        return self.fi.mod.BatchDecodeWithPagedKVCacheWrapper(
            self._float_ws_for(f"graph bs={bucket}"),
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.use_tensor_cores,
            paged_kv_indptr_buffer=self.kv_indptr_gpu[: bucket + 1],
            paged_kv_indices_buffer=self.kv_indices_gpu,
            paged_kv_last_page_len_buffer=self.last_gpu[:bucket],
        )

    def _plan(self, wrapper: Any, layout: PagedLayout, tot: int, *, graph: bool) -> None:
        wrapper.plan(*self._paged_plan_args(layout, tot), pos_encoding_mode="NONE", **self._common_kw())

    def _replan(self, slot: GraphSlot, layout: PagedLayout, tot: int) -> None:
        if self.replan == "full":
            self._plan(slot.wrapper, layout, tot, graph=True)
            return
        n = layout.padded_batch_size
        host_indptr = self.kv_indptr_cpu[: n + 1] if self.metadata == "host" else None
        self.fi.fast_decode_plan(
            slot.wrapper,
            *self._paged_plan_args(layout, tot),
            pos_encoding_mode="NONE",
            non_blocking=True,
            global_override_indptr_cpu=host_indptr,
            **self._common_kw(),
        )

    def _run(self, wrapper: Any, q: Any, out: Any) -> Any:
        return wrapper.run(q, (self.env.k_cache, self.env.v_cache))
