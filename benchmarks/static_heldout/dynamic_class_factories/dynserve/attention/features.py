"""Feature mixins. None of them is a backend on its own: ``make_backend`` stacks the ones a
deployment asks for on top of ``AttentionBackendBase`` (highest ``priority`` first in the MRO).

Each mixin names its set-up ``feature_init`` (run by the base, base-first), adds its share of
per-step planning in ``prepare_feature_metadata`` and passes the batch on with ``super()``.
"""

from __future__ import annotations

from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from ..config import TRACE_KERNELS, MiB
from ..forward_batch import ForwardBatch
from .tracing import traced


class DecodeFeature:
    feature_name = "decode"
    priority = 0

    def init_decode(self) -> None:
        nbytes = self.cfg.float_workspace_bytes()
        self.decode_workspace = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        self.decode_workspace.zero_()  # trtllm-gen keeps split-k semaphores in it
        wrapper_cls = traced(BatchDecodeWithPagedKVCacheWrapper) if TRACE_KERNELS else BatchDecodeWithPagedKVCacheWrapper
        self.wrappers["decode"] = wrapper_cls(
            self.decode_workspace,
            self._kv_layout,
            use_tensor_cores=self.use_tensor_cores,
            backend=self.decode_backend,
        )

    feature_init = init_decode

    def prepare_feature_metadata(self, batch: ForwardBatch) -> None:
        md = self.forward_metadata
        if batch.mode.is_decode():
            if self.decode_via_prefill:
                # large GQA groups: the prefill kernel's tensor cores beat the decode kernel
                self.plan_prefill(batch)
                md.decode_wrapper = self.wrappers["prefill"]
            else:
                self.plan_decode(batch)
                md.decode_wrapper = self.wrappers["decode"]
        super().prepare_feature_metadata(batch)

    def forward_decode(self, q, layer, batch: ForwardBatch) -> torch.Tensor:
        kv = self.kv_pool.layer_cache(layer.layer_id)
        if self.decode_via_prefill:
            return self.wrappers["prefill"].run(q, kv)  # expect: FC108
        return self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108


class PrefillFeature:
    feature_name = "prefill"
    priority = 0
    # paged prefill over a cached prefix gets its own scratch: long prompts need the split-kv space
    PAGED_PREFILL_WORKSPACE_BYTES = 384 * MiB

    def init_prefill(self) -> None:
        self.prefill_workspace = torch.zeros(self.PAGED_PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.wrappers["prefill"] = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.wrappers["ragged"] = BatchPrefillWithRaggedKVCacheWrapper(self.float_workspace, self._kv_layout)
        if self.num_draft_tokens:
            self.verify_workspace = torch.empty(self.cfg.verify_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
            self.wrappers["verify"] = BatchPrefillWithPagedKVCacheWrapper(
                self.verify_workspace, self._kv_layout, backend="fa2"
            )

    feature_init = init_prefill

    def prepare_feature_metadata(self, batch: ForwardBatch) -> None:
        md = self.forward_metadata
        if batch.mode.is_verify():
            self.plan_verify(batch)
            md.prefill_wrapper = self.wrappers["verify"]
        elif batch.mode.is_extend():
            if batch.has_prefix:
                self.plan_prefill(batch)
                md.prefill_wrapper = self.wrappers["prefill"]
            else:
                self.plan_ragged(batch)
                md.prefill_wrapper = self.wrappers["ragged"]
        super().prepare_feature_metadata(batch)

    def forward_extend(self, q, k, v, layer, batch: ForwardBatch) -> torch.Tensor:
        md = self.forward_metadata
        if md.prefill_wrapper is self.wrappers["ragged"]:
            return md.prefill_wrapper.run(q, k, v)
        return md.prefill_wrapper.run(q, self.kv_pool.layer_cache(layer.layer_id))


class GraphFeature:
    """Graph-mode decode wrappers, one per captured batch size, bound to the base's device buffers.

    The factory adds the capture/replay metadata methods to the class namespace when this feature
    is present (``factory._GRAPH_METHODS``).
    """

    feature_name = "graph"
    priority = 10

    def init_graph_wrappers(self) -> None:
        cfg = self.cfg
        self.graph_workspace = torch.empty(cfg.float_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.cuda_graph_batch_sizes:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,  # ok: FC103
                use_cuda_graph=True,
                use_tensor_cores=self.use_tensor_cores,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend=self.decode_backend,
            )
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.captured_plan_info: Dict[int, object] = {}
        self.captured_kv_len: Dict[int, int] = {}

    feature_init = init_graph_wrappers

    def graph_memory_bytes(self) -> int:
        int_ws = sum(w._int_workspace_buffer.numel() for w in self.graph_wrappers.values())  # expect: FC103
        return int_ws + self.graph_workspace.numel()

    def debug_dump(self) -> dict:
        """Snapshot of the graph-bound buffers for bug reports (tests and the admin endpoint)."""
        return {
            "kv_indptr": self.kv_indptr.cpu(),  # ok: FC101
            "kv_last_page_len": self.kv_last_page_len.cpu(),
        }


class TrtllmDecodeFeature:
    """Blackwell: decode through trtllm-gen wrappers, prefill through the trtllm context kernel."""

    feature_name = "trtllm"
    priority = 30
    decode_backend = "trtllm-gen"

    def init_trtllm(self) -> None:
        # context-kernel scratch, sized like the float workspace
        self.trtllm_ctx_workspace = torch.empty(self.cfg.float_workspace_bytes(), dtype=torch.uint8, device=self.device)  # expect: FC105

    feature_init = init_trtllm

    def prepare_feature_metadata(self, batch: ForwardBatch) -> None:
        md = self.forward_metadata
        if batch.mode.is_extend():
            bs = batch.batch_size
            pt = batch.page_table_cpu[:bs]
            md.block_tables = torch.zeros((bs, self.max_pages_per_seq), dtype=torch.int32, device=self.device)  # ok: FC107
            md.block_tables[:, : pt.shape[1]].copy_(torch.from_numpy(pt), non_blocking=True)
            md.cu_kv_lens = torch.nn.functional.pad(torch.cumsum(batch.seq_lens, 0, dtype=torch.int32), (1, 0))
        super().prepare_feature_metadata(batch)

    def forward_extend(self, q, k, v, layer, batch: ForwardBatch) -> torch.Tensor:
        if not batch.mode.is_extend():
            return super().forward_extend(q, k, v, layer, batch)
        md = self.forward_metadata
        max_kv_len = int(batch.host_seq_lens.max())
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=self.kv_pool.layer_cache(layer.layer_id),
            workspace_buffer=self.trtllm_ctx_workspace,
            block_tables=md.block_tables,
            seq_lens=batch.seq_lens,
            max_q_len=batch.max_extend_len,
            max_kv_len=max_kv_len,
            bmm1_scale=layer.scaling,
            bmm2_scale=1.0,
            batch_size=batch.batch_size,
            cum_seq_lens_q=batch.qo_indptr,
            cum_seq_lens_kv=md.cu_kv_lens,
        )
