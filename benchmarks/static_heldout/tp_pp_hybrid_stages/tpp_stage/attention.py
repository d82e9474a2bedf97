"""Per-stage FlashInfer attention: every stage plans its own layers' wrappers.

Micro-batch ``m`` owns row ``m`` of the 2-D graph buffers and one graph-mode decode
wrapper per bucket; chunked-prefill tokens mixed into a micro-batch run a ragged wrapper.
"""

from typing import Dict, List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from tpp.config import _WS_MIB, HybridConfig
from tpp.metadata import MicroBatch, build_chunk_wrapper


class StageAttention:
    def __init__(self, cfg: HybridConfig, stage: int, device):
        self.cfg = cfg
        self.stage = stage
        self.device = device
        self.num_mb = cfg.num_microbatches
        self.max_bs = cfg.max_batch_size
        self.max_tokens = cfg.max_batch_size + cfg.max_chunk_tokens
        self.heads = cfg.heads_per_rank
        self.kv_heads = cfg.kv_heads_per_rank
        self._sm_scale = cfg.head_dim ** -0.5

        self.decode_ws = torch.zeros(_WS_MIB["decode"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        chunk_bytes = cfg.max_chunk_tokens * self.heads * (cfg.head_dim + 1) * 4 * 2
        self.chunk_ws = torch.empty(chunk_bytes, dtype=torch.uint8, device=device)
        self.trt_ws = torch.empty(cfg.max_batch_size * self.heads * 64 * 1024, dtype=torch.uint8, device=device)  # ok: FC105
        self.trt_ws.zero_()

        self.kv_indptr = torch.zeros(self.num_mb, self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(self.num_mb, cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(self.num_mb, self.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(self.num_mb, self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(self.num_mb, self.max_bs, dtype=torch.int32, pin_memory=True)
        self.chunk_qo_indptr = torch.zeros(cfg.max_chunk_tokens + 1, dtype=torch.int32, device=device)
        self.init_stage_buffers()

        self.mb_wrappers: List[Dict[int, BatchDecodeWithPagedKVCacheWrapper]] = []
        for m in range(self.num_mb):
            per_bs: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
            for bs in cfg.graph_batch_sizes:
                per_bs[bs] = BatchDecodeWithPagedKVCacheWrapper(
                    self.decode_ws,
                    "NHD",
                    use_cuda_graph=True,
                    paged_kv_indptr_buffer=self.kv_indptr[m, : bs + 1],
                    paged_kv_indices_buffer=self.kv_indices[m],
                    paged_kv_last_page_len_buffer=self.kv_last_page_len[m, :bs],
                )
            self.mb_wrappers.append(per_bs)
        self.overflow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD")
        self.chunk_wrapper = build_chunk_wrapper(self.chunk_ws)

    def init_stage_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_indices.zero_()  # ok: FC104
        self.kv_last_page_len.fill_(1)

    def reset(self) -> None:
        # after every step: forget the host view of every micro-batch and
        # remember the device rows' addresses for the graph sanity check
        self.row_ptrs = []
        for dev_row, host_row in zip(self.kv_indptr, self.kv_indptr_host):
            host_row.zero_()  # ok: FC104
            self.row_ptrs.append(dev_row.data_ptr())

    @staticmethod
    def _pad_rows(last_page_len: torch.Tensor, real: int) -> None:
        last_page_len[real:] = 1

    # ------------------------------------------------------------- per step
    def prepare_microbatch(self, mb: MicroBatch, bs: int) -> int:
        m = mb.index
        real = mb.num_decode
        self.kv_indptr_host[m, : real + 1] = mb.kv_indptr_cpu
        self.kv_indptr_host[m, real + 1 : bs + 1] = self.kv_indptr_host[m, real]
        nnz = int(self.kv_indptr_host[m, real])
        max_len = int(mb.seq_lens_cpu.max())  # ok: FC101
        self.kv_indptr[m, : bs + 1].copy_(self.kv_indptr_host[m, : bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[m, :nnz].copy_(mb.kv_indices, non_blocking=True)
        self.kv_last_page_len[m, :real].copy_(mb.last_page_len)
        if bs in self.mb_wrappers[m]:
            self._plan_decode(mb, bs, nnz)
        else:
            self._plan_overflow(mb)
        if mb.num_chunk_tokens:
            self._plan_chunk(mb)
        self._pad_rows(self.kv_last_page_len[m, :bs], real)  # expect: FC104
        return max_len

    def _plan_decode(self, mb: MicroBatch, bs: int, nnz: int) -> None:
        w = self.mb_wrappers[mb.index][bs]
        fixed = vars(w).get("_fixed_batch_size", bs)  # expect: FC103
        if fixed != bs:
            raise RuntimeError(f"micro-batch {mb.index}: wrapper captured for {fixed}, asked for {bs}")
        w.plan(  # expect: FC102
            self.kv_indptr_host[mb.index, : bs + 1],
            self.kv_indices[mb.index, :nnz],
            mb.last_page_len,
            self.heads,
            self.kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    def _plan_overflow(self, mb: MicroBatch) -> None:
        real = mb.num_decode
        self.last_page_len_host[mb.index, :real] = (mb.seq_lens_cpu - 1) % self.cfg.page_size + 1
        self.overflow_wrapper.plan(  # ok: FC102
            mb.kv_indptr_cpu,
            mb.kv_indices,
            self.last_page_len_host[mb.index, :real],
            self.heads,
            self.kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=torch.bfloat16,
        )

    def _plan_chunk(self, mb: MicroBatch) -> None:
        n = mb.chunk_cu_seqlens_cpu.shape[0] - 1
        torch.cumsum(mb.token_counts[mb.num_decode :], dim=0, out=self.chunk_qo_indptr[1 : n + 1])
        plan_kwargs = dict(
            qo_indptr=self.chunk_qo_indptr[: n + 1],
            kv_indptr=mb.chunk_cu_seqlens_cpu,
            num_qo_heads=self.heads,
            num_kv_heads=self.kv_heads,
            head_dim_qk=self.cfg.head_dim,
            causal=True,
        )
        self.chunk_wrapper.plan(**plan_kwargs)  # expect: FC102

    # ------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, layer_kv: torch.Tensor, m: int, bs: int) -> torch.Tensor:
        w = self.mb_wrappers[m].get(bs, self.overflow_wrapper)
        return w.run(q, layer_kv)  # ok: FC108

    def forward_chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.chunk_wrapper.run(q, k, v)  # expect: FC108

    def forward_decode_trtllm(self, q, layer_kv, block_tables, seq_lens, max_len: int) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q, layer_kv, self.trt_ws, block_tables, seq_lens, max_len,
            bmm1_scale=self._sm_scale, bmm2_scale=1.0,
        )
