"""FlashInfer attention for the multi-LoRA engine.

Decode runs through graph-mode wrappers per batch bucket (one shared set of max-size buffers, sliced per bucket) or an
eager wrapper past the largest bucket; prompt-tuning adapters add learned virtual tokens that every decode step attends
through a ragged wrapper, merged by log-sum-exp; Blackwell parts use trtllm-gen decode and context kernels.
"""
import logging
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)
from flashinfer.cascade import merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from mlora.config import EngineConfig

logger = logging.getLogger(__name__)


def _pad_rows(buf: torch.Tensor, start: int, end: int) -> None:
    buf[start:end] = 1


class LoraAttnBackend:
    WORKSPACE_BYTES = 256 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.sm_scale = cfg.head_dim ** -0.5
        self._kv_layout = "NHD"
        layout = self._kv_layout  # ok: FC103
        max_bs = cfg.max_decode_bs

        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_ws_bytes = cfg.max_prefill_tokens * cfg.num_qo_heads * (cfg.head_dim + 1) * 4 * 2
        self.prefill_workspace = torch.zeros(prefill_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.trt_workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.ctx_workspace = self._alloc_ctx_workspace(cfg.max_prefill_tokens * cfg.num_qo_heads * 512)

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)

        self.prefill_qo_indptr = torch.zeros(cfg.max_prefill_reqs + 1, dtype=torch.int32, device=device)
        self.prefill_kv_indptr = torch.zeros(cfg.max_prefill_reqs + 1, dtype=torch.int32, device=device)
        self.prefill_block_tables = torch.zeros(cfg.max_prefill_reqs, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.prefill_seq_lens = torch.zeros(cfg.max_prefill_reqs, dtype=torch.int32, device=device)
        self.prefill_bs = 0
        self.prefill_max_q = 0
        self.prefill_max_kv = 0

        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.workspace,
                layout,
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.decode_buckets
        }
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.workspace, layout, use_tensor_cores=True)
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, layout)
        self.vtoken_prefix = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, layout)

        vt_rows = cfg.max_loras * cfg.max_vtokens
        self.vtoken_k = [torch.zeros(vt_rows, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self.vtoken_v = [torch.zeros(vt_rows, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float16, device=device) for _ in range(cfg.num_layers)]
        self.vtoken_gather = torch.zeros(max_bs * cfg.max_vtokens, dtype=torch.int64, device=device)
        self.vtoken_rows = 0
        self.graph_bs: Optional[int] = None
        self.page_spans: Dict[int, Tuple[int, int]] = {}

    def _alloc_ctx_workspace(self, nbytes: int) -> torch.Tensor:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()
        return ws

    def page_span(self, rid: int) -> Tuple[int, int]:
        return self.page_spans.get(rid, (0, 0))

    # ------------------------------------------------------------------ planning
    def _plan_vtokens(self, bs: int, vtok_counts_host: torch.Tensor, vtok_slots_host: torch.Tensor) -> None:
        total = int(vtok_counts_host.sum())
        self.vtoken_rows = total
        if total == 0:
            return
        rows_host = torch.cat([
            torch.arange(c, dtype=torch.int64) + s * self.cfg.max_vtokens
            for s, c in zip(vtok_slots_host.tolist(), vtok_counts_host.tolist())
        ])
        self.vtoken_gather[:total].copy_(rows_host, non_blocking=True)
        qo_indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(vtok_counts_host, 0, out=kv_indptr_host[1:])
        self.vtoken_prefix.plan(qo_indptr_host, kv_indptr_host, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, causal=False, q_data_type=torch.float16)

    def refresh_decode(self, real_bs: int, rids: List[int], page_ids_host: torch.Tensor, pages_per_req_host: torch.Tensor, last_len_host: torch.Tensor, block_table_host: torch.Tensor, vtok_counts_host: torch.Tensor, vtok_slots_host: torch.Tensor) -> None:
        bs = self.graph_bs if self.graph_bs is not None else real_bs
        self.kv_indptr_host[0] = 0
        torch.cumsum(pages_per_req_host, 0, out=self.kv_indptr_host[1 : real_bs + 1])
        self.kv_indptr_host[real_bs + 1 : bs + 1] = self.kv_indptr_host[real_bs]
        self.kv_last_page_len_host[:real_bs] = last_len_host
        n = int(self.kv_indptr_host[bs])
        for i, rid in enumerate(rids):
            self.page_spans[rid] = (int(self.kv_indptr_host[i]), int(self.kv_indptr_host[i + 1]))

        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(page_ids_host[:n], non_blocking=True)
        self.kv_last_page_len[:real_bs].copy_(self.kv_last_page_len_host[:real_bs], non_blocking=True)
        if self.cfg.use_trtllm:
            self.block_tables[:real_bs, : block_table_host.shape[1]].copy_(block_table_host, non_blocking=True)
            self.seq_lens[:real_bs].copy_((pages_per_req_host - 1) * self.cfg.page_size + last_len_host, non_blocking=True)
            self.seq_lens[real_bs:bs].zero_()
        self._plan_vtokens(bs, vtok_counts_host, vtok_slots_host)
        if self.graph_bs is not None:
            self.decode_wrappers[bs].plan(self.kv_indptr_host[: bs + 1], self.kv_indices[:n], self.kv_last_page_len_host[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, data_type=torch.float16)  # ok: FC102
        else:
            plan = self.eager_decode.plan
            plan(self.kv_indptr_host[: bs + 1], self.kv_indices[:n], self.kv_last_page_len_host[:bs], self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, data_type=torch.float16)  # ok: FC102
        _pad_rows(self.kv_last_page_len, real_bs, bs)  # expect: FC104

    def plan_prefill(self, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, page_ids_host: torch.Tensor, last_len_host: torch.Tensor, block_table_host: torch.Tensor, max_q: int, max_kv: int) -> None:
        n = qo_indptr_host.numel() - 1
        self.prefill_qo_indptr[: n + 1].copy_(qo_indptr_host, non_blocking=True)
        self.prefill_kv_indptr[: n + 1].copy_(kv_indptr_host, non_blocking=True)
        self.prefill_block_tables[:n, : block_table_host.shape[1]].copy_(block_table_host, non_blocking=True)
        pages_host = kv_indptr_host[1:] - kv_indptr_host[:-1]
        self.prefill_seq_lens[:n].copy_((pages_host - 1) * self.cfg.page_size + last_len_host, non_blocking=True)
        self.prefill_bs, self.prefill_max_q, self.prefill_max_kv = n, max_q, max_kv
        page_ids = page_ids_host.to(self.device, non_blocking=True)
        self.prefill.plan(qo_indptr_host, self.prefill_kv_indptr[: n + 1], page_ids, last_len_host, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size, causal=True, q_data_type=torch.float16)  # expect: FC102

    def init_graph_buffers(self, bs: int) -> None:
        self.kv_indptr[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices[:bs].zero_()
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:bs] = 1
        self.decode_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.kv_last_page_len_host[:bs],
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            data_type=torch.float16,
        )

    # ------------------------------------------------------------------ forward
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.cfg.use_trtllm:
            bs = q.shape[0]
            return trtllm_batch_decode_with_kv_cache(
                query=q, kv_cache=kv_cache, workspace_buffer=self.trt_workspace,
                block_tables=self.block_tables[:bs], seq_lens=self.seq_lens[:bs],
                max_seq_len=self.cfg.max_seq_len, bmm1_scale=self.sm_scale, bmm2_scale=1.0,
            )
        w = self.decode_wrappers.get(self.graph_bs, self.eager_decode)
        out, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.vtoken_rows > 0:
            vk = self.vtoken_k[layer_id].index_select(0, self.vtoken_gather)
            vv = self.vtoken_v[layer_id].index_select(0, self.vtoken_gather)
            v_out, v_lse = self.vtoken_prefix.run_return_lse(q, vk, vv)  # expect: FC108
            out, _ = merge_state(out, lse, v_out, v_lse)
        return out

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.cfg.use_trtllm:
            n = self.prefill_bs
            return trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=kv_cache, workspace_buffer=self.ctx_workspace,
                block_tables=self.prefill_block_tables[:n], seq_lens=self.prefill_seq_lens[:n],
                max_q_len=self.prefill_max_q, max_kv_len=self.prefill_max_kv,
                bmm1_scale=self.sm_scale, bmm2_scale=1.0, batch_size=n,
                cum_seq_lens_q=self.prefill_qo_indptr[: n + 1], cum_seq_lens_kv=self.prefill_kv_indptr[: n + 1],
            )
        return self.prefill.run(q, kv_cache)
