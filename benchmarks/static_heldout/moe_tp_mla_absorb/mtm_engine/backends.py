"""MLA attention backends chosen by ``EngineConfig.attn_backend``: FlashInfer (graph-mode MLA wrappers per
batch size, eager wrappers for extend and for the sparse top-k layers) and trtllm-gen decode on top of it."""
from __future__ import annotations

import abc
import bisect
import functools
from typing import Dict, Optional, Tuple, Type

import torch
import triton
from flashinfer.mla import BatchMLAPagedAttentionWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from mtm.config import EngineConfig
from mtm.kvcache import ForwardBatch, MLAKVPool, create_kv_indices_kernel


class AttentionBackend(abc.ABC):
    @abc.abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...
    @abc.abstractmethod
    def forward_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor: ...
    @abc.abstractmethod
    def forward_extend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor: ...


class ChunkedPrefillMLAWrapper(BatchMLAPagedAttentionWrapper):
    """The eager MLA wrapper (extend and oversize decode batches)."""
    def kernel_family(self) -> str:
        return "trtllm" if self._backend.startswith("trtllm") else "fa"  # expect: FC103


class FlashInferMLABackend(AttentionBackend):
    GRAPH_WS_BYTES = 384 * 1024 * 1024
    BLOCK = 128

    def __init__(self, cfg: EngineConfig, device: torch.device, kv_pool: MLAKVPool):
        m = cfg.model
        self.cfg, self.device, self.kv_pool = cfg, device, kv_pool
        self.num_heads, self.kv_lora_rank, self.rope_dim = cfg.local_heads, m.kv_lora_rank, m.qk_rope_head_dim
        self.qk_nope, self.sm_scale = m.qk_nope_head_dim, (m.qk_nope_head_dim + m.qk_rope_head_dim) ** -0.5
        self.max_bs, self.graph_bs_list, self.topk = cfg.max_running_requests, sorted(cfg.cuda_graph_bs), m.index_topk

        self.eager_workspace = torch.empty(cfg.mla_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_mla = ChunkedPrefillMLAWrapper(self.eager_workspace, backend="fa2")
        self.sparse_mla = BatchMLAPagedAttentionWrapper(self.eager_workspace, backend="fa2")

        self.eager_kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.eager_kv_indices = torch.zeros(cfg.max_total_tokens, dtype=torch.int32, device=device)
        self.sparse_indices = torch.zeros(self.max_bs * self.topk, dtype=torch.int32, device=device)
        self.dense_flag = torch.zeros(self.max_bs, dtype=torch.bool, device=device)
        self.qo_indptr_cpu = torch.arange(self.max_bs + 1, dtype=torch.int32).pin_memory()
        self.sparse_indptr_cpu = (torch.arange(self.max_bs + 1, dtype=torch.int32) * self.topk).pin_memory()
        self.graph_bs: Optional[int] = None
        self._plan_info: Optional[Tuple[int, int, str]] = None
        self.graph_mla: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.init_cuda_graph_state()

    def init_cuda_graph_state(self) -> None:
        max_bs, dev = self.graph_bs_list[-1], self.device
        self.qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * self.cfg.max_context_len, dtype=torch.int32, device=dev)
        self.kv_lens = torch.empty(max_bs, dtype=torch.int32, device=dev)
        self.kv_lens.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_lens_cpu = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        for bs in self.graph_bs_list:
            self.graph_mla[bs] = BatchMLAPagedAttentionWrapper(
                self.graph_workspace, use_cuda_graph=True,
                qo_indptr=self.qo_indptr[: bs + 1], kv_indptr=self.kv_indptr[: bs + 1],
                kv_indices=self.kv_indices, kv_len_arr=self.kv_lens[:bs], backend="fa2",
            )

    def graph_bs_for(self, bs: int) -> int:
        return self.graph_bs_list[bisect.bisect_left(self.graph_bs_list, bs)]

    def mark_dense(self, req_pool_indices: torch.Tensor) -> None:
        self.dense_flag.index_fill_(0, req_pool_indices.long(), True)

    def _mla_args(self, causal: bool) -> tuple:
        return (self.num_heads, self.kv_lora_rank, self.rope_dim, 1, causal, self.sm_scale, torch.bfloat16, torch.bfloat16)

    def _fill_indices(self, bs: int, fb: ForwardBatch, kv_indptr: torch.Tensor, kv_indices: torch.Tensor) -> None:
        r2t = self.kv_pool.req_to_token
        grid = (bs, triton.cdiv(fb.max_seq_len, self.BLOCK))
        create_kv_indices_kernel[grid](r2t, fb.req_pool_indices, kv_indptr, fb.seq_lens, kv_indices, r2t.stride(0), BLOCK=self.BLOCK)

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if bs > self.max_bs:
            raise ValueError(f"batch of {bs} > max_running_requests={self.max_bs}; seq_lens={fb.seq_lens}")  # ok: FC101
        self.graph_bs = None
        if int(fb.seq_lens_cpu.max()) > self.cfg.max_context_len:  # ok: FC101
            raise ValueError(f"a context in the batch exceeds max_context_len={self.cfg.max_context_len}")
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(fb.seq_lens_cpu, 0, dtype=torch.int32, out=kv_indptr_cpu[1:])
        total = int(kv_indptr_cpu[-1])
        self.eager_kv_indptr[: bs + 1].copy_(kv_indptr_cpu, non_blocking=True)
        self._fill_indices(bs, fb, self.eager_kv_indptr, self.eager_kv_indices)
        if fb.is_decode:
            self.eager_mla.plan(
                self.qo_indptr_cpu[: bs + 1], kv_indptr_cpu, self.eager_kv_indices[:total], fb.seq_lens_cpu,
                *self._mla_args(causal=False),
            )
            self._plan_sparse(bs, fb)
        else:
            qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
            torch.cumsum(fb.extend_lens_cpu, 0, dtype=torch.int32, out=qo_indptr_cpu[1:])
            self.eager_mla.plan(  # expect: FC102
                qo_indptr_cpu, kv_indptr_cpu, self.eager_kv_indices[:total], kv_len_arr=fb.seq_lens,
                num_heads=self.num_heads, head_dim_ckv=self.kv_lora_rank, head_dim_kpe=self.rope_dim, page_size=1,
                causal=True, sm_scale=self.sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            )
        # our own record of what was planned, for the step's trace
        self._plan_info = (bs, total, fb.mode)  # ok: FC103

    def _plan_sparse(self, bs: int, fb: ForwardBatch) -> None:
        kv_len_cpu = torch.clamp(fb.seq_lens_cpu, max=self.topk)
        self.sparse_mla.plan(
            self.qo_indptr_cpu[: bs + 1], self.sparse_indptr_cpu[: bs + 1], self.sparse_indices[: bs * self.topk],
            kv_len_cpu, *self._mla_args(causal=False),
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = bs
        kv_indptr_host = torch.arange(bs + 1, dtype=torch.int32)
        kv_lens_host = torch.ones(bs, dtype=torch.int32)
        self.graph_mla[bs].plan(  # ok: FC102
            self.qo_indptr_cpu[: bs + 1], kv_indptr_host, self.kv_indices[:bs], kv_lens_host, *self._mla_args(causal=False)
        )
        self._plan_sparse(bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        padded = self.graph_bs_for(bs)
        self.graph_bs = padded
        self.kv_lens_cpu[:bs].copy_(fb.seq_lens_cpu)
        self.kv_lens_cpu[bs:padded] = 0
        torch.cumsum(self.kv_lens_cpu[:padded], 0, dtype=torch.int32, out=self.kv_indptr_cpu[1 : padded + 1])
        total = int(self.kv_indptr_cpu[padded])
        self.kv_lens[:padded].copy_(self.kv_lens_cpu[:padded], non_blocking=True)  # ok: FC104
        self.kv_indptr[: padded + 1].copy_(self.kv_indptr_cpu[: padded + 1], non_blocking=True)
        self._fill_indices(bs, fb, self.kv_indptr, self.kv_indices)  # ok: FC104
        self._plan_sparse(bs, fb)
        self.graph_mla[padded].plan(  # ok: FC102
            self.qo_indptr_cpu[: padded + 1], self.kv_indptr_cpu[: padded + 1], self.kv_indices[:total],
            self.kv_lens_cpu[:padded], *self._mla_args(causal=False),
        )
        # padded rows: empty segments at the end of the packed indices
        self.kv_indptr[bs + 1 : padded + 1].fill_(total)  # expect: FC104

    def forward_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor:
        w = self.eager_mla if self.graph_bs is None else self.graph_mla[self.graph_bs]
        return w.run(q_nope, q_pe, self.kv_pool.ckv[layer_id], self.kv_pool.kpe[layer_id])  # ok: FC108

    def forward_sparse_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.sparse_mla.run(q_nope, q_pe, self.kv_pool.ckv[layer_id], self.kv_pool.kpe[layer_id])  # expect: FC108

    def forward_extend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.eager_mla.run(q_nope, q_pe, self.kv_pool.ckv[layer_id], self.kv_pool.kpe[layer_id])


@functools.lru_cache(maxsize=None)
def get_trtllm_mla_workspace(nbytes: int, device: str) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


class TrtllmMLABackend(FlashInferMLABackend):
    """Decode through trtllm-gen on page-aligned token slots; extend stays on FlashInfer."""
    def __init__(self, cfg: EngineConfig, device: torch.device, kv_pool: MLAKVPool):
        super().__init__(cfg, device, kv_pool)
        self.page_size, self.max_seq_len = cfg.trtllm_page_size, cfg.max_context_len
        self.trt_workspace = get_trtllm_mla_workspace(cfg.trtllm_workspace_bytes(), str(device))
        self.block_tables = torch.zeros(self.max_bs, cfg.max_context_len // self.page_size, dtype=torch.int32, device=device)
        self.seq_lens_buf = torch.zeros(self.max_bs, dtype=torch.int32, device=device)

    def _fill_block_tables(self, bs: int, fb: ForwardBatch) -> None:
        ps = self.page_size
        nblk = triton.cdiv(fb.max_seq_len, ps)
        first = self.kv_pool.req_to_token[fb.req_pool_indices, : nblk * ps : ps]
        self.block_tables[:bs, :nblk].copy_(first // ps)
        self.seq_lens_buf[:bs].copy_(fb.seq_lens)
        self.max_seq_len = fb.max_seq_len

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if not fb.is_decode:
            return super().init_forward_metadata(fb)
        self.graph_bs = None
        self._fill_block_tables(fb.batch_size, fb)
        self._plan_sparse(fb.batch_size, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        self.graph_bs = self.graph_bs_for(bs)
        self._fill_block_tables(bs, fb)
        self._plan_sparse(bs, fb)

    def forward_decode(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor:
        n = q_nope.shape[0]
        query = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)
        kv = self.kv_pool.kv[layer_id].view(-1, self.page_size, self.kv_lora_rank + self.rope_dim).unsqueeze(1)
        out = trtllm_batch_decode_with_kv_cache_mla(
            query=query, kv_cache=kv, workspace_buffer=self.trt_workspace, qk_nope_head_dim=self.qk_nope,
            kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.rope_dim, block_tables=self.block_tables[:n],
            seq_lens=self.seq_lens_buf[:n], max_seq_len=self.max_seq_len, bmm1_scale=self.sm_scale,
        )
        return out.squeeze(1)


BACKENDS: Dict[str, Type[FlashInferMLABackend]] = {"flashinfer": FlashInferMLABackend, "trtllm": TrtllmMLABackend}


def make_backend(cfg: EngineConfig, device: torch.device, kv_pool: MLAKVPool) -> FlashInferMLABackend:
    if cfg.attn_backend not in BACKENDS:
        raise ValueError(f"unknown attn_backend {cfg.attn_backend!r}; choose from {sorted(BACKENDS)}")
    return BACKENDS[cfg.attn_backend](cfg, device, kv_pool)
