"""FlashInfer attention for the tenant server: eager decode/prefill, the shared-prefix pass, graph decode."""
import logging
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tqp.config import DECODE_WORKSPACE_MB, ServerConfig
from tqp.pages import RefcountedPageTable

logger = logging.getLogger(__name__)


@dataclass
class StepBatch:
    """What the server hands the backend each step."""

    batch_size: int
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor             # device
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor            # device, read by the ragged-q kernels
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor           # device page ids
    kv_last_page_len_cpu: torch.Tensor
    block_tables: Optional[torch.Tensor] = None
    shared_prefix_pages: Optional[torch.Tensor] = None
    shared_prefix_last_len: int = 0


@dataclass
class DecodeMeta:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    max_seq_len: int = 0
    seq_lens: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None


def make_trtllm_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


class TenantFlashInferBackend:
    def __init__(self, cfg: ServerConfig, page_table: RefcountedPageTable, device: torch.device):
        self.cfg = cfg
        self.page_table = page_table
        self.device = device
        self._kv_layout = "NHD"
        self.decode_workspace = torch.zeros(DECODE_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace = (
            make_trtllm_workspace(cfg.trtllm_workspace_bytes, device) if cfg.use_trtllm_decode else None
        )
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, use_tensor_cores=True
        )
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        # attention of the whole batch against the shared system-prompt pages, merged with the suffix
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.last_page_len_gpu = torch.ones(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DecodeMeta] = None
        self.out_buf: Optional[torch.Tensor] = None

    # ---- set-up -------------------------------------------------------------------------------

    def init_cuda_graph_state(self, max_bs: int, max_pages: int) -> None:
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.cuda_graph_last_page_len.fill_(1)  # ok: FC104
        self.cuda_graph_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(max_bs * self.cfg.num_qo_heads * 512 * 4, dtype=torch.uint8, device=self.device)  # ok: FC106

    # ---- per step -----------------------------------------------------------------------------

    def _plan_decode(self, wrapper: BatchDecodeWithPagedKVCacheWrapper, kv_indptr, kv_indices, last_page_len):
        wrapper.plan(  # expect: FC102
            kv_indptr,
            kv_indices,
            last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    def _plan_prefix(self, fb: StepBatch) -> None:
        n = fb.shared_prefix_pages.numel()
        qo_indptr_host = torch.tensor([0, int(fb.qo_indptr_cpu[-1])], dtype=torch.int32)
        prefix_indptr_host = torch.tensor([0, n], dtype=torch.int32)
        prefix_last_host = torch.tensor([fb.shared_prefix_last_len], dtype=torch.int32)
        self.prefix_wrapper.plan(  # ok: FC102
            qo_indptr_host,
            prefix_indptr_host,
            fb.shared_prefix_pages,
            prefix_last_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=False,
            q_data_type=torch.bfloat16,
        )

    def init_forward_metadata(self, fb: StepBatch) -> None:
        bs = fb.batch_size
        if fb.is_decode:
            self._plan_decode(self.decode_wrapper, fb.kv_indptr_cpu, fb.kv_indices, self.last_page_len_gpu[:bs])
        else:
            if self.out_buf is None:
                self.out_buf = torch.empty(  # ok: FC107
                    (self.cfg.max_num_tokens, self.cfg.num_qo_heads, self.cfg.head_dim),
                    dtype=torch.bfloat16,
                    device=self.device,
                )
            self.prefill_wrapper.plan(  # expect: FC102
                fb.qo_indptr,
                fb.kv_indptr_cpu,
                fb.kv_indices,
                fb.kv_last_page_len_cpu,
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        self._plan_prefix(fb)
        self.forward_metadata = DecodeMeta(
            self.decode_wrapper,
            max_seq_len=int(fb.seq_lens_cpu.max()),
            seq_lens=fb.seq_lens,
            block_tables=fb.block_tables,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_pages: int, max_seq_len: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
        )
        self.graph_wrappers[bs] = w
        indptr_host = torch.arange(bs + 1, dtype=torch.int32) * (num_pages // bs)
        self._plan_decode(w, indptr_host, self.cuda_graph_kv_indices[:num_pages], self.cuda_graph_last_page_len_host[:bs])
        self.forward_metadata = DecodeMeta(w, max_seq_len=max_seq_len)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: StepBatch) -> None:
        raw_bs = fb.batch_size
        total = int(fb.kv_indptr_cpu[raw_bs])
        if self.cuda_graph_kv_indices.numel() < total:
            self.cuda_graph_kv_indices = torch.empty(total * 2, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indptr_host[: raw_bs + 1] = fb.kv_indptr_cpu[: raw_bs + 1]
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = total
        self.cuda_graph_kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.cuda_graph_kv_indices[:total].copy_(fb.kv_indices[:total])
        self.cuda_graph_last_page_len_host[:raw_bs] = fb.kv_last_page_len_cpu[:raw_bs]
        self._plan_prefix(fb)
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.cuda_graph_kv_indices[:total],
            self.cuda_graph_last_page_len_host[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        self.cuda_graph_last_page_len[:raw_bs].copy_(fb.kv_last_page_len_cpu[:raw_bs], non_blocking=True)  # expect: FC104
        self.forward_metadata = DecodeMeta(
            w,
            max_seq_len=int(fb.seq_lens[:raw_bs].max()),  # expect: FC101
            seq_lens=fb.seq_lens,
            block_tables=fb.block_tables,
        )

    # ---- kernels ------------------------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        meta = self.forward_metadata
        if self.trtllm_workspace is not None:
            o = trtllm_batch_decode_with_kv_cache(
                q, kv_cache, self.trtllm_workspace, meta.block_tables, meta.seq_lens, meta.max_seq_len
            )
            return o
        o, lse = meta.decode_wrapper.run(q, kv_cache, return_lse=True)  # ok: FC108
        # every tenant's requests start with its system prompt: attend to the shared pages too
        po, plse = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        out, _ = merge_state(o, lse, po, plse)
        return out

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        o, lse = self.prefill_wrapper.run_return_lse(q, kv_cache)
        po, plse = self.prefix_wrapper.run_return_lse(q, kv_cache)
        out, _ = merge_state(o, lse, po, plse)
        return out
