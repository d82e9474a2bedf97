"""FlashInfer paged decode: an eager wrapper per step, graph-mode wrappers per capture bucket."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from ubr import ModelConfig, StepBatch, workspace_bytes_for


class FlashInferPagedBackend:
    name = "fi_paged"

    def __init__(self, cfg: ModelConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.workspace = torch.empty(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.empty(workspace_bytes_for(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")

        max_bs = cfg.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bs: Optional[int] = None
        self.qk_scale_buf: Optional[torch.Tensor] = None

    # ---- set-up -------------------------------------------------------------------------------
    def init_cuda_graph_state(self, buckets: Sequence[int]) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        for bs in buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def _check_graph_state(self) -> None:
        assert len(self.graph_wrappers) > 0, "init_cuda_graph_state must run before capture"  # ok: FC109

    def _plan_kwargs(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.page_size,
            data_type=torch.bfloat16,
        )

    # ---- per step (eager) ---------------------------------------------------------------------
    def init_forward_metadata(self, batch: StepBatch) -> None:
        self.graph_bs = None
        if batch.max_seq_len > self.cfg.max_pages_per_seq * self.page_size:
            raise ValueError("a sequence outgrew the page table")
        num_pages = int(batch.kv_indptr_cpu[-1])  # ok: FC101
        if self.qk_scale_buf is None:
            self.qk_scale_buf = torch.full((self.cfg.num_qo_heads,), self.cfg.head_dim**-0.5, device=self.device)  # ok: FC107
        self.decode_wrapper.plan(  # expect: FC102
            batch.kv_indptr,
            batch.kv_indices[:num_pages],
            batch.kv_last_page_len_cpu,
            **self._plan_kwargs(),
        )

    # ---- capture / replay ---------------------------------------------------------------------
    def _fill_host_indptr(self, bs: int, raw_bs: int, seq_lens_cpu: torch.Tensor) -> int:
        pages = (seq_lens_cpu[:raw_bs] + self.page_size - 1) // self.page_size
        self.kv_indptr_cpu[1 : raw_bs + 1] = torch.cumsum(pages, 0)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[:raw_bs] = (seq_lens_cpu[:raw_bs] - 1) % self.page_size + 1
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        return int(self.kv_indptr_cpu[raw_bs])

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor) -> None:
        self._check_graph_state()
        self.graph_bs = bs
        nnz = self._fill_host_indptr(bs, bs, seq_lens_cpu)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            **self._plan_kwargs(),
        )

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        raw_bs: int,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        page_table: torch.Tensor,
    ) -> None:
        self.graph_bs = bs
        nnz = self._fill_host_indptr(bs, raw_bs, seq_lens_cpu)
        self.kv_indices[:nnz].copy_(page_table[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1],
            self.kv_indices[:nnz],
            self.kv_last_page_len_cpu[:bs],
            **self._plan_kwargs(),
        )
        # Padding rows point at page 0; keep their last-page length at one token.
        self.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104

    # ---- attention ----------------------------------------------------------------------------
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.decode_wrapper if self.graph_bs is None else self.graph_wrappers[self.graph_bs]
        return w.run(q, kv_cache)  # ok: FC108

    def scrub_pages(self, start: int, end: int) -> None:
        """Clear the page ids of a finished request so a stale row cannot read recycled pages."""
        self.kv_indices[start:end].zero_()  # expect: FC104

    def describe_graphs(self) -> Dict[int, int]:
        return {bs: w._fixed_batch_size for bs, w in self.graph_wrappers.items()}  # expect: FC103
