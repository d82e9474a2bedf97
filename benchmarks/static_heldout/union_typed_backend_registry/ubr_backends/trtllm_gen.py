"""trtllm-gen decode and prefill through FlashInfer's wrappers (HND layout, eager only)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from ubr import TRTLLM_WS_BYTES, ModelConfig, StepBatch, workspace_bytes_for
from ubr_backends.compat import PLAN_INFO_ATTR


class TrtllmGenBackend:
    name = "trtllm_gen"

    def __init__(self, cfg: ModelConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self._backend = "trtllm-gen"
        self.workspace = torch.zeros(TRTLLM_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(workspace_bytes_for(cfg), dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND", backend=self._backend)
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            self.prefill_workspace, "HND", backend=self._backend
        )
        self.page_indices: Optional[torch.Tensor] = None

    def describe(self) -> str:
        return f"{self._backend}/page{self.page_size}"  # ok: FC103

    def init_cuda_graph_state(self, buckets: Sequence[int]) -> None:
        # The trtllm-gen path keeps one wrapper for every batch size.
        self.max_graph_bs = max(buckets)

    def _plan_host(self, indptr_cpu: torch.Tensor, indices: torch.Tensor, last_cpu: torch.Tensor) -> None:
        self.decode_wrapper.plan(
            indptr_cpu,
            indices,
            last_cpu,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
            data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        nnz = int(batch.kv_indptr_cpu[bs])
        if self.page_indices is None or self.page_indices.numel() < nnz:
            self.page_indices = torch.zeros(2 * max(nnz, 1), dtype=torch.int32, device=self.device)  # expect: FC107
        self.page_indices[:nnz].copy_(batch.kv_indices[:nnz])
        self.decode_wrapper.plan(  # expect: FC102
            batch.kv_indptr_cpu[: bs + 1],
            self.page_indices[:nnz],
            batch.kv_last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
            data_type=torch.bfloat16,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor) -> None:
        indptr_cpu = torch.arange(bs + 1, dtype=torch.int32)
        last_cpu = seq_lens_cpu.to(torch.int32)
        self._plan_host(indptr_cpu, torch.zeros(bs, dtype=torch.int32, device=self.device), last_cpu)

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        raw_bs: int,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        page_table: torch.Tensor,
    ) -> None:
        live = int((seq_lens > 0).sum())  # expect: FC101
        pages = (seq_lens_cpu[:bs] + self.page_size - 1) // self.page_size
        indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        indptr_cpu[1:] = torch.cumsum(pages, 0)
        last_cpu = ((seq_lens_cpu[:bs] - 1) % self.page_size + 1).to(torch.int32)
        self.live_rows = live
        self._plan_host(indptr_cpu, page_table, last_cpu)

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.decode_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def scrub_pages(self, start: int, end: int) -> None:
        # Nothing is bound to a captured graph here.
        return None

    def plan_signature(self) -> Optional[tuple]:
        info = getattr(self.decode_wrapper, PLAN_INFO_ATTR, None)  # expect: FC103
        return None if info is None else tuple(info)
