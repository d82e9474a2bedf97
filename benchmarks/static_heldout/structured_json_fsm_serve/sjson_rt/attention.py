"""FlashInfer attention for the structured-output server.

Graph-mode decode wrappers per batch bucket share one max-size indptr / indices / last-page-length buffer (sliced per
bucket); an eager decode wrapper runs when graphs are disabled; a paged prefill wrapper prefills jump-forward tokens
over existing pages; a ragged prefill wrapper prefills new prompts; the rendered JSON schema is a shared system prompt
attended by every decode step through a prefix wrapper and merged by log-sum-exp.
"""
import logging
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state

from sjson.config import DECODE_WORKSPACE_BYTES, ServerConfig

logger = logging.getLogger(__name__)


class StructuredAttention:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch_size

        self.graph_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.eager_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.extend_workspace = torch.empty(cfg.extend_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.schema_workspace = torch.zeros(cfg.extend_workspace_bytes() // 4, dtype=torch.uint8, device=device)  # ok: FC106

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in cfg.graph_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
                backend=decode_backend,
            )
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", use_tensor_cores=True)
        self.extend_prefill = BatchPrefillWithPagedKVCacheWrapper(self.extend_workspace, "NHD", backend="fa2")
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(self.extend_workspace, "NHD", backend="fa2")
        self.schema_prefix = BatchPrefillWithPagedKVCacheWrapper(self.schema_workspace, "NHD")

        self.schema_pages_cpu = torch.zeros(0, dtype=torch.int32)
        self.schema_prefix_len = 0
        self._plan_info: Dict[int, tuple] = {}
        self.use_graph = False

    # ------------------------------------------------------------------ host tables
    def bucket_for(self, bs: int) -> Optional[int]:
        for bucket in self.cfg.graph_buckets:
            if bucket >= bs:
                return bucket
        return None

    def set_schema_prefix(self, schema_pages_cpu: torch.Tensor, prefix_len: int) -> None:
        self.schema_pages_cpu = schema_pages_cpu
        self.schema_prefix_len = prefix_len

    def _fill_host_tables(self, bs: int, real_bs: int, pages_per_req_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> None:
        self.kv_indptr_cpu[0] = 0
        torch.cumsum(pages_per_req_cpu[:real_bs], 0, out=self.kv_indptr_cpu[1 : real_bs + 1])
        self.kv_indptr_cpu[real_bs + 1 : bs + 1] = self.kv_indptr_cpu[real_bs]
        self.kv_last_page_len_cpu[:real_bs] = last_len_cpu[:real_bs]
        self.kv_last_page_len_cpu[real_bs:bs] = 1

    def _plan_schema(self, bs: int) -> None:
        if self.schema_prefix_len == 0:
            return
        npages = self.schema_pages_cpu.numel()
        qo_indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr_host = qo_indptr_host * npages
        indices_host = self.schema_pages_cpu.repeat(bs)
        last_host = torch.full((bs,), (self.schema_prefix_len - 1) % self.cfg.page_size + 1, dtype=torch.int32)
        self.schema_prefix.plan(
            qo_indptr_host, kv_indptr_host, indices_host, last_host,
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            causal=False, q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ per-step planning
    def prepare_replay(self, bs: int, real_bs: int, page_ids_cpu: torch.Tensor, pages_per_req_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> None:
        if real_bs > bs:
            raise ValueError(f"batch of {real_bs} does not fit bucket {bs}; last pages {self.kv_last_page_len[:real_bs]}")  # ok: FC101
        self._fill_host_tables(bs, real_bs, pages_per_req_cpu, last_len_cpu)
        num_pages = int(self.kv_indptr_cpu[bs])  # ok: FC101
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:num_pages].copy_(page_ids_cpu[:num_pages], non_blocking=True)
        self.kv_last_page_len[:real_bs].copy_(self.kv_last_page_len_cpu[:real_bs], non_blocking=True)
        self._plan_schema(bs)
        wrapper = self.graph_wrappers[bs]
        wrapper.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:num_pages], self.kv_last_page_len_cpu[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, data_type=torch.bfloat16)  # ok: FC102
        self._plan_info[bs] = (real_bs, num_pages)  # ok: FC103
        # padded rows attend one token of the scratch page
        self.kv_last_page_len[real_bs:bs].fill_(1)  # expect: FC104

    def plan_decode_eager(self, bs: int, page_ids_cpu: torch.Tensor, pages_per_req_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> None:
        self._fill_host_tables(bs, bs, pages_per_req_cpu, last_len_cpu)
        num_pages = int(self.kv_indptr_cpu[bs])
        self.kv_indices[:num_pages].copy_(page_ids_cpu[:num_pages], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_cpu[:bs], non_blocking=True)
        self._plan_schema(bs)
        self.eager_decode.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:num_pages], self.kv_last_page_len[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, data_type=torch.bfloat16)  # expect: FC102

    def plan_extend(self, bs: int, extend_lens_cpu: torch.Tensor, page_ids_cpu: torch.Tensor, pages_per_req_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> torch.Tensor:
        # the extend's query offsets are also the model's varlen offsets for RoPE, so they live on the device
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        qo_indptr[1:] = torch.cumsum(extend_lens_cpu[:bs], 0).to(self.device, non_blocking=True)
        self._fill_host_tables(bs, bs, pages_per_req_cpu, last_len_cpu)
        num_pages = int(self.kv_indptr_cpu[bs])
        page_ids = page_ids_cpu[:num_pages].to(self.device, non_blocking=True)
        self.extend_prefill.plan(qo_indptr, self.kv_indptr_cpu[: bs + 1], page_ids, self.kv_last_page_len_cpu[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True, q_data_type=torch.bfloat16)  # expect: FC102
        return qo_indptr

    def plan_prefill(self, prompt_lens_cpu: torch.Tensor) -> torch.Tensor:
        cu_seqlens_cpu = torch.zeros(prompt_lens_cpu.numel() + 1, dtype=torch.int32)
        torch.cumsum(prompt_lens_cpu, 0, out=cu_seqlens_cpu[1:])
        self.ragged_prefill.plan(cu_seqlens_cpu, cu_seqlens_cpu, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=True, q_data_type=torch.bfloat16)  # ok: FC102
        return cu_seqlens_cpu

    # ------------------------------------------------------------------ capture
    def init_capture_metadata(self, bs: int) -> None:
        # dummy batch: every row owns the scratch page with one token
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_cpu[:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:bs].zero_()
        self._plan_schema(bs)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_cpu[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ forward
    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        wrapper = self.graph_wrappers[bs] if self.use_graph else self.eager_decode
        out, lse = wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        if self.schema_prefix_len > 0:
            p_out, p_lse = self.schema_prefix.run_return_lse(q, kv_cache)  # expect: FC108
            out, _ = merge_state(out, lse, p_out, p_lse)
        return out

    def extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.extend_prefill.run(q, kv_cache)

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)
