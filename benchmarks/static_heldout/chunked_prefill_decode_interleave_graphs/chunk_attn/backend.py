"""Attention for interleaved steps.

Mixed steps: decode rows through an eager decode wrapper, prefill chunks through a ragged wrapper
(each chunk's own tokens, causal) and a paged prefill wrapper (the chunk against the prefix its
earlier chunks left in the cache), merged by LSE. Decode-only steps replay a graph per bucket whose
wrappers are bound to shared index buffers; padding rows get empty page lists.
"""

from typing import Dict, Optional

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from chunkserve.config import ChunkConfig, WsSize
from chunk_attn.metadata import ChunkMetadata, DecodeOnlyMetadata, DevicePageTable


class InterleavedAttnBackend:
    def __init__(self, cfg: ChunkConfig, page_table: DevicePageTable, device):
        self.cfg = cfg
        self.page_table = page_table
        self.device = device
        self.sm_scale = cfg.head_dim**-0.5
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

        self.ragged_workspace = torch.zeros(WsSize.RAGGED, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.paged_workspace = torch.zeros(cfg.paged_prefill_workspace_bytes(), dtype=torch.uint8, device=device)
        self.paged_prefill = BatchPrefillWithPagedKVCacheWrapper(self.paged_workspace, "NHD")
        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD")
        self.decode_tc_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.decode_tc = BatchDecodeWithPagedKVCacheWrapper(self.decode_tc_workspace, "NHD", use_tensor_cores=True)
        # GQA groups of 4 and more run faster on the tensor-core decode kernels
        self.use_tensor_cores = cfg.gqa_group >= 4
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_workspace.fill_(0)

        max_bs = max(cfg.decode_buckets)
        self.dec_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.dec_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.dec_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_bufs = {
            "kv_indptr": self.dec_kv_indptr,
            "kv_indices": self.dec_kv_indices,
            "last_page_len": self.dec_last_page_len,
        }
        self.dec_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.dec_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}

        self.mixed_kv_indices = torch.zeros(cfg.token_budget, dtype=torch.int32, device=device)
        self.qo_indptr_cpu = torch.zeros(cfg.max_running + 1, dtype=torch.int32, pin_memory=True)
        self.slot_mapping = torch.zeros(cfg.max_running + cfg.token_budget, dtype=torch.int64, device=device)
        self.md: Optional[ChunkMetadata] = None
        self.graph_bs: Optional[int] = None

    def _decode_kwargs(self) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
        )

    # ------------------------------------------------------------------ set-up
    def init_graph_state(self) -> None:
        self.dec_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.decode_buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.dec_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.dec_kv_indices,
                paged_kv_last_page_len_buffer=self.dec_last_page_len[:bs],
            )

    # ------------------------------------------------------------------ decode-only steps
    def _plan_graph(self, bs: int, md: DecodeOnlyMetadata) -> None:
        n = md.num_decode
        self.dec_indptr_cpu[: n + 1].copy_(md.dec_kv_indptr_cpu)
        self.dec_indptr_cpu[n + 1 : bs + 1] = md.total_pages
        self.dec_last_page_len_cpu[:n].copy_(md.dec_last_page_len_cpu)
        self.dec_last_page_len_cpu[n:bs] = 1
        self.graph_decode[bs].plan(  # ok: FC102
            self.dec_indptr_cpu[: bs + 1], self.dec_kv_indices, self.dec_last_page_len_cpu[:bs], **self._decode_kwargs()
        )

    def prepare_decode_capture(self, bs: int, md: DecodeOnlyMetadata) -> None:
        self.md = None
        self.graph_bs = bs
        self._plan_graph(bs, md)

    def prepare_decode_replay(self, bs: int, md: DecodeOnlyMetadata) -> None:
        n = md.num_decode
        nnz = md.total_pages
        self.md = None
        self.graph_bs = bs
        # gather each row's pages from the device page table into the bound index buffer
        row_of_page = torch.repeat_interleave(md.dec_rows, md.pages_per_row)  # expect: FC101
        first = torch.repeat_interleave(md.dec_kv_indptr_dev[:n], md.pages_per_row, output_size=nnz)  # ok: FC101
        col = torch.arange(nnz, dtype=torch.int64, device=self.device) - first
        self.graph_bufs["kv_indices"][:nnz].copy_(self.page_table.table[row_of_page, col])  # ok: FC104
        self.slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
        self.slot_mapping[n:bs].zero_()
        self._plan_graph(bs, md)
        # padding rows after the last real row: empty page lists
        self.graph_bufs["kv_indptr"][n + 1 : bs + 1] = nnz  # expect: FC104

    def prepare_decode_eager(self, md: DecodeOnlyMetadata) -> None:
        self.md = None
        self.graph_bs = None
        self.slot_mapping[: md.num_decode].copy_(md.slot_mapping, non_blocking=True)
        w = self.decode_tc if self.use_tensor_cores else self.decode_eager
        w.plan(md.dec_kv_indptr_cpu, md.dec_kv_indices, md.dec_last_page_len_cpu, **self._decode_kwargs())

    # ------------------------------------------------------------------ mixed steps
    def prepare_mixed(self, md: ChunkMetadata) -> None:
        self.md = md
        self.graph_bs = None
        cfg = self.cfg
        total_prefix_pages = int(md.prefix_kv_indptr_cpu[-1])  # ok: FC101
        if self.mixed_kv_indices.numel() < total_prefix_pages:
            self.mixed_kv_indices.resize_(total_prefix_pages)  # expect: FC107
        if self.qo_indptr_cpu.numel() < md.num_rows + 1:
            self.qo_indptr_cpu = torch.zeros(2 * md.num_rows + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.qo_indptr_cpu[: md.num_rows + 1].copy_(md.qo_indptr_cpu)
        if total_prefix_pages:
            row_of_page = torch.repeat_interleave(md.chunk_rows_dev, md.prefix_pages_dev, output_size=total_prefix_pages)
            first = torch.repeat_interleave(
                md.prefix_kv_indptr_gpu[:-1].long(), md.prefix_pages_dev, output_size=total_prefix_pages
            )
            col = torch.arange(total_prefix_pages, dtype=torch.int64, device=self.device) - first
            flat = row_of_page * cfg.max_pages_per_seq + col
            torch.index_select(self.page_table.table.view(-1), 0, flat, out=self.mixed_kv_indices[:total_prefix_pages])
        self.slot_mapping[: md.num_tokens].copy_(md.slot_mapping, non_blocking=True)
        self.ragged.plan(  # expect: FC102
            md.ragged_qo_indptr_cpu,
            md.ragged_qo_indptr,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )
        prefix_args = dict(
            qo_indptr=md.ragged_qo_indptr_cpu,
            paged_kv_indptr=md.prefix_kv_indptr_gpu,
            paged_kv_indices=self.mixed_kv_indices[:total_prefix_pages],
            paged_kv_last_page_len=md.prefix_last_page_len_cpu,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=cfg.page_size,
            causal=False,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )
        self.paged_prefill.plan(**prefix_args)  # expect: FC102
        if md.num_decode and not md.use_trtllm:
            dec_args = (md.dec_kv_indptr_cpu, md.dec_kv_indices, md.dec_last_page_len_cpu)
            w = self.decode_tc if self.use_tensor_cores else self.decode_eager
            w.plan(*dec_args, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)  # ok: FC102
        # stale offsets past this step's rows must not leak into a shorter next step
        self.qo_indptr_cpu[md.num_rows + 1 :].zero_()  # ok: FC104

    # ------------------------------------------------------------------ forward
    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        slots = self.slot_mapping[: k.shape[0]]
        cache = self.kv[layer]
        pages, offs = slots // self.cfg.page_size, slots % self.cfg.page_size
        cache[pages, 0, offs] = k
        cache[pages, 1, offs] = v

    def decode_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.kv[layer]
        if self.use_tensor_cores:
            return self.decode_tc.run(q, kv)  # expect: FC108
        if self.graph_bs is not None:
            w = self.graph_decode[self.graph_bs]
        else:
            w = self.decode_eager
        return w.run(q, kv)  # ok: FC108

    def mixed_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md = self.md
        kv = self.kv[layer]
        nd = md.num_decode
        parts = []
        if nd:
            q_dec = q[: md.qo_indptr[nd]]  # expect: FC101
            if md.use_trtllm:
                parts.append(
                    trtllm_batch_decode_with_kv_cache(
                        q_dec,
                        kv,
                        self.trtllm_workspace,
                        md.dec_block_tables,
                        md.dec_seq_lens,
                        md.dec_max_len,
                        bmm1_scale=self.sm_scale,
                        bmm2_scale=1.0,
                    )
                )
            else:
                w = self.decode_tc if self.use_tensor_cores else self.decode_eager
                parts.append(w.run(q_dec, kv))
        q_pre, k_pre, v_pre = q[nd:], k[nd:], v[nd:]
        o_own, lse_own = self.ragged.run(q_pre, k_pre, v_pre, return_lse=True)
        o_pfx, lse_pfx = self.paged_prefill.run(q_pre, kv, return_lse=True)
        o_pre, _ = merge_state(o_own, lse_own, o_pfx, lse_pfx)
        parts.append(o_pre.to(q.dtype))
        return torch.cat(parts, dim=0)
