"""MLA decode on the decode cluster.

Graph-mode `BatchMLAPagedAttentionWrapper`s per batch bucket share max-size qo/kv indptr, indices and kv_len buffers;
an eager MLA wrapper runs past the largest bucket; requests whose last partial page is still in flight attend over
their landed tail tokens through a small eager MLA wrapper, merged by log-sum-exp; Blackwell uses trtllm-gen MLA.
"""
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer.cascade import merge_state
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
from flashinfer.mla import BatchMLAPagedAttentionWrapper

from xdc.config import DecodeClusterConfig, WsTier

_MLA_WS: Dict[Tuple[str, int], torch.Tensor] = {}


def get_mla_workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    key = (str(device), nbytes)
    ws = _MLA_WS.get(key)
    if ws is None:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        _MLA_WS[key] = ws
    return ws


class MlaDecodeAttention:
    def __init__(self, cfg: DecodeClusterConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.sm_scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
        max_bs = cfg.max_decode_bs

        self.workspace = torch.zeros(WsTier.DECODE, dtype=torch.uint8, device=device)  # expect: FC106
        self.tail_workspace = torch.zeros(cfg.tail_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.trt_ws = get_mla_workspace(device, cfg.trtllm_workspace_bytes)

        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr_host = torch.arange(cfg.max_eager_bs + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_gpu = torch.zeros(cfg.max_eager_bs + 1, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_req, dtype=torch.int32, device=device)

        self.graph_mla: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        for bs in cfg.decode_buckets:
            self.graph_mla[bs] = BatchMLAPagedAttentionWrapper(
                self.workspace,
                use_cuda_graph=True,
                qo_indptr=self.qo_indptr[: bs + 1],
                kv_indptr=self.kv_indptr[: bs + 1],
                kv_indices=self.kv_indices,
                kv_len_arr=self.kv_lens[:bs],
            )
        self.eager_mla = BatchMLAPagedAttentionWrapper(self.workspace)
        self.tail_mla = BatchMLAPagedAttentionWrapper(self.tail_workspace)

        tail_rows = cfg.max_eager_bs * cfg.tail_max_tokens
        self.tail_ckv = [torch.zeros(tail_rows, 1, cfg.kv_lora_rank, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.tail_kpe = [torch.zeros(tail_rows, 1, cfg.qk_rope_head_dim, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.tail_lens_np = np.zeros(cfg.max_eager_bs, dtype=np.int32)
        self.has_pending_tail = False
        self.graph_bs: Optional[int] = None
        self._stage_cursor = 0

    def reserve_rows(self, rid: int, n: int) -> int:
        off = self._stage_cursor
        self._stage_cursor = (off + n) % (self.cfg.max_pages - self.cfg.max_pages_per_req)
        return off

    def set_tail(self, row: int, tokens: int) -> None:
        self.tail_lens_np[row] = tokens
        self.has_pending_tail = bool(self.tail_lens_np.any())

    def _plan_tail(self, bs: int) -> None:
        c = self.cfg
        lens_np = self.tail_lens_np[:bs]
        tail_lens_host = torch.from_numpy(lens_np.copy())
        tail_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(tail_lens_host, 0, out=tail_indptr_host[1:])
        rows = [np.arange(r * c.tail_max_tokens, r * c.tail_max_tokens + int(k), dtype=np.int32) for r, k in enumerate(lens_np)]
        tail_indices = torch.from_numpy(np.concatenate(rows)).to(self.device, non_blocking=True)
        self.tail_mla.plan(self.qo_indptr_host[: bs + 1], tail_indptr_host, tail_indices, tail_lens_host, c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim, 1, False, self.sm_scale, torch.bfloat16, torch.bfloat16)

    def stage_batch(self, bs: int, real_bs: int, page_ids_host: torch.Tensor, lens_host: torch.Tensor, block_table_host: torch.Tensor) -> None:
        c = self.cfg
        pages_per_req = (lens_host + c.page_size - 1) // c.page_size
        self.kv_indptr_host[0] = 0
        torch.cumsum(pages_per_req, 0, out=self.kv_indptr_host[1 : real_bs + 1])
        self.kv_indptr_host[real_bs + 1 : bs + 1] = self.kv_indptr_host[real_bs]
        self.kv_lens_host[:real_bs] = lens_host
        self.kv_lens_host[real_bs:bs] = 0
        n = int(self.kv_indptr_host[bs])
        self.kv_indices[:n].copy_(page_ids_host[:n], non_blocking=True)  # ok: FC104
        if c.use_trtllm_mla:
            self.block_tables[:real_bs, : block_table_host.shape[1]].copy_(block_table_host, non_blocking=True)
        if self.has_pending_tail:
            self._plan_tail(bs)
        w = self.graph_mla[bs]
        w.plan(  # ok: FC102
            qo_indptr=self.qo_indptr_host[: bs + 1],
            kv_indptr=self.kv_indptr_host[: bs + 1],
            kv_indices=self.kv_indices[:n],
            kv_len_arr=self.kv_lens_host[:bs],
            num_heads=c.num_heads,
            head_dim_ckv=c.kv_lora_rank,
            head_dim_kpe=c.qk_rope_head_dim,
            page_size=c.page_size,
            causal=False,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )
        # the step appends one token per request: count it now so the next step starts from the new lengths
        torch.add(self.kv_lens[:real_bs], 1, out=self.kv_lens[:real_bs])  # expect: FC104

    def stage_eager(self, bs: int, page_ids_host: torch.Tensor, lens_host: torch.Tensor) -> None:
        c = self.cfg
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum((lens_host + c.page_size - 1) // c.page_size, 0, out=indptr_host[1:])
        self.kv_indptr_gpu[: bs + 1].copy_(indptr_host, non_blocking=True)
        page_ids_dev = page_ids_host.to(self.device, non_blocking=True)
        if self.has_pending_tail:
            self._plan_tail(bs)
        args = (self.qo_indptr_host[: bs + 1], self.kv_indptr_gpu[: bs + 1], page_ids_dev, lens_host)
        self.eager_mla.plan(*args, c.num_heads, c.kv_lora_rank, c.qk_rope_head_dim, c.page_size, False, self.sm_scale, torch.bfloat16, torch.bfloat16)  # expect: FC102

    def init_capture_tables(self, bs: int) -> None:
        c = self.cfg
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_lens_host[:bs] = 1
        self.kv_indices[:bs].zero_()
        self.graph_mla[bs].plan(
            qo_indptr=self.qo_indptr_host[: bs + 1], kv_indptr=self.kv_indptr_host[: bs + 1],
            kv_indices=self.kv_indices[:bs], kv_len_arr=self.kv_lens_host[:bs],
            num_heads=c.num_heads, head_dim_ckv=c.kv_lora_rank, head_dim_kpe=c.qk_rope_head_dim,
            page_size=c.page_size, causal=False, sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ forward
    def _trtllm_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        bs = q_nope.shape[0]
        query = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)
        out = trtllm_batch_decode_with_kv_cache_mla(
            query=query, kv_cache=kv_cache.unsqueeze(1), workspace_buffer=self.trt_ws,
            qk_nope_head_dim=c.qk_nope_head_dim, kv_lora_rank=c.kv_lora_rank, qk_rope_head_dim=c.qk_rope_head_dim,
            block_tables=self.block_tables[:bs], seq_lens=self.kv_lens[:bs], max_seq_len=c.max_seq_len,
            bmm1_scale=self.sm_scale, bmm2_scale=1.0,
        )
        return out.squeeze(1)

    def forward_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        if self.cfg.use_trtllm_mla:
            return self._trtllm_decode(q_nope, q_pe, kv_cache)
        w = self.graph_mla[self.graph_bs] if self.graph_bs is not None else self.eager_mla
        out, lse = w.run(q_nope, q_pe, ckv_cache, kpe_cache, return_lse=True)  # ok: FC108
        if self.has_pending_tail:
            t_out, t_lse = self.tail_mla.run(q_nope, q_pe, self.tail_ckv[layer_id], self.tail_kpe[layer_id], return_lse=True)  # expect: FC108
            out, _ = merge_state(out, lse, t_out, t_lse)
        return out
