"""FlashInfer attention with graph-mode decode per bucket, a trtllm-gen eager decode for
oversize batches, a paged prefill, and an optional shadow check against an FA2 reference."""

from typing import Dict

import flashinfer
import torch

from td_engine.batch import StepBatch
from td_engine.config import EngineConfig
from td_engine.workspace import default_workspace_bytes, trtllm_workspace
from telemetry import NvmlShim


class TelemetryAttnBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device, nvml: NvmlShim):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "HND"
        mb = max(cfg.buckets)
        self.kv_indptr_buf = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.ones(mb, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        # the prefill rope kernel reads qo_indptr on the device
        self.qo_indptr_dev = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=device)
        self.shadow_err = torch.zeros((), dtype=torch.float32, device=device)

        self.graph_workspace = torch.zeros(default_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        free = nvml.free_bytes(device.index or 0)
        ref_bytes = min(cfg.max_reference_workspace_bytes, free // 16)
        self.reference_workspace = torch.zeros(ref_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        self.eager_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            trtllm_workspace(cfg.trtllm_workspace_bytes(), device), self._kv_layout, backend="trtllm-gen"
        )
        self.reference_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.reference_workspace, self._kv_layout)
        self.graph_wrappers: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self._build_graph_wrappers()

    def _build_graph_wrappers(self) -> None:
        self.last_page_len_buf.fill_(1)  # ok: FC104
        for bs in self.cfg.buckets:
            self.graph_wrappers[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                self._kv_layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )

    def all_wrappers(self) -> list:
        return [self.prefill, self.eager_decode, self.reference_decode, *self.graph_wrappers.values()]

    def _decode_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- per step -----------------------------------------------------------------------
    def init_forward_metadata(self, batch: StepBatch) -> None:
        c = self.cfg
        n = batch.batch_size
        self.kv_indptr_host[: n + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.last_page_len_host[:n].copy_(torch.from_numpy(batch.last_page_len_np))
        indices = torch.from_numpy(batch.kv_indices_np).to(self.device, non_blocking=True)
        if batch.is_prefill:
            self.qo_indptr_dev[: n + 1].copy_(torch.from_numpy(batch.qo_indptr_np), non_blocking=True)
            args = (self.qo_indptr_dev[: n + 1], self.kv_indptr_host[: n + 1], indices, self.last_page_len_host[:n])
            self.prefill.plan(  # expect: FC102
                *args, c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True, q_data_type=torch.bfloat16
            )
            return
        self.eager_decode.plan(self.kv_indptr_host[: n + 1], indices, self.last_page_len_host[:n], **self._decode_kwargs())
        if c.shadow_check:
            self.reference_decode.plan(
                self.kv_indptr_host[: n + 1], indices, self.last_page_len_host[:n], **self._decode_kwargs()
            )

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        dummy_indptr = torch.arange(bs + 1, dtype=torch.int32)
        dummy_last = torch.ones(bs, dtype=torch.int32)
        self.graph_wrappers[bs].plan(dummy_indptr, self.kv_indices_buf[:bs], dummy_last, **self._decode_kwargs())
        if self.cfg.shadow_check:
            self.reference_decode.plan(dummy_indptr, self.kv_indices_buf[:bs], dummy_last, **self._decode_kwargs())

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        real = batch.batch_size
        nnz = int(batch.kv_indptr_np[-1])
        self.kv_indptr_host[: real + 1].copy_(torch.from_numpy(batch.kv_indptr_np))
        self.kv_indptr_host[real + 1 : bs + 1] = nnz
        self.last_page_len_host[:real].copy_(torch.from_numpy(batch.last_page_len_np))
        self.last_page_len_host[real:bs] = 1
        self.kv_indices_buf[:nnz].copy_(torch.from_numpy(batch.kv_indices_np), non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_host[:bs], **self._decode_kwargs()
        )
        if self.cfg.shadow_check:
            self.reference_decode.plan(
                self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:nnz], self.last_page_len_host[:bs], **self._decode_kwargs()
            )

    def reset_graph_metadata(self) -> None:
        """After an aborted step: clear the graph metadata so no stale KV ranges survive."""
        self.kv_indptr_buf.zero_()  # expect: FC104

    # ---- kernels ------------------------------------------------------------------------
    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.eager_decode
        out = w.run(q, kv_cache)  # ok: FC108
        if self.cfg.shadow_check:
            ref = self.reference_decode.run(q, kv_cache)  # expect: FC108
            torch.maximum(self.shadow_err, (out - ref).abs().amax(), out=self.shadow_err)
        return out
