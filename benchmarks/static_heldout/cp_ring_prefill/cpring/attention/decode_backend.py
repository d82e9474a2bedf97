"""Sharded decode.

Each rank attends over the prompt KV it holds, the ranks all-gather their
partial (output, LSE) pairs and merge them, and the replicated tail of
generated tokens is merged in last.  Decode batches up to the largest captured
size replay a CUDA graph; its shard wrapper is bound to ``kv_indptr``,
``cuda_graph_kv_indices`` and ``kv_last_page_len``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, merge_state, merge_states

from cpring.attention.ring_prefill import RingPrefillAttention
from cpring.forward_batch import CPForwardBatch, ForwardMode
from cpring.kv_pool import ShardKVPool
from cpring.parallel.ring_comm import RingComm


@dataclasses.dataclass
class CPConfig:
    num_layers: int = 32
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    hidden_size: int = 4096
    vocab_size: int = 128256
    page_size: int = 16
    max_running_requests: int = 128
    max_pages_per_req: int = 4096
    shard_pages: int = 65536
    tail_pages: int = 16384
    cuda_graph_bs: tuple = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclasses.dataclass
class DecodeMetadata:
    shard_wrapper: BatchDecodeWithPagedKVCacheWrapper
    tail_wrapper: BatchDecodeWithPagedKVCacheWrapper


def _alloc_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws


class CPDecodeBackend:
    def __init__(self, cfg: CPConfig, pool: ShardKVPool, comm: RingComm, ring_attn: RingPrefillAttention,
                 device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.comm = comm
        self.ring_attn = ring_attn
        self.device = device
        self.cp_size = comm.world
        max_bs = cfg.max_running_requests
        H, D = cfg.num_qo_heads, cfg.head_dim
        # split-k partials of the largest decode batch: 32 chunks x (output + lse) in fp32
        ws_bytes = max_bs * H * (D + 1) * 4 * 32
        self.float_ws = _alloc_workspace(ws_bytes, device, zeroed=False)
        self.graph_ws = _alloc_workspace(ws_bytes, device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.float_ws, "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.tail_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.float_ws, "NHD", backend="fa2")

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # landing buffers of the cross-rank merge, read by the captured graphs
        self.gather_v = torch.zeros(self.cp_size * max_bs, H, D, dtype=torch.bfloat16, device=device)
        self.gather_s = torch.zeros(self.cp_size * max_bs, H, dtype=torch.float32, device=device)
        self.decode_cuda_graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DecodeMetadata] = None
        self.max_shard_len = 0
        self.stats = {"extend_tokens": 0}

    def _plan_args(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    page_size=c.page_size, q_data_type=torch.bfloat16)

    # ----------------------------------------------------------------- eager
    def init_forward_metadata(self, fb: CPForwardBatch) -> None:
        if fb.forward_mode == ForwardMode.EXTEND:
            self.stats["extend_tokens"] += sum(fb.local_lens_cpu)  # ok: FC101
            self.ring_attn.plan_ring_steps(fb)
            return
        bs = fb.batch_size
        indptr_cpu, indices, last_cpu = self.pool.shard_table(fb.req_pool_indices_cpu)
        self.kv_last_page_len[:bs].copy_(last_cpu, non_blocking=True)
        c = self.cfg
        plan_kwargs = dict(
            indptr=indptr_cpu, indices=indices, last_page_len=self.kv_last_page_len[:bs],
            num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
            page_size=c.page_size, q_data_type=torch.bfloat16,
        )
        self.decode_wrapper.plan(**plan_kwargs)  # expect: FC102
        t_indptr, t_indices, t_last = self.pool.tail_table(fb.req_pool_indices_cpu, fb.seq_lens_cpu)
        self.tail_wrapper.plan(t_indptr, t_indices, t_last, **self._plan_args())
        self.forward_metadata = DecodeMetadata(self.decode_wrapper, self.tail_wrapper)
        self.max_shard_len = -(-int(fb.seq_lens_cpu.max()) // self.cp_size)  # ok: FC101

    # ------------------------------------------------------------ cuda graph
    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.cuda_graph_kv_indices = torch.zeros(
            max_bs * self.cfg.max_pages_per_req, dtype=torch.int32, device=self.device
        )
        # eager warm-up steps left their page tables here
        self.kv_indptr.zero_()  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend="fa2",
        )
        ones = torch.ones(bs, dtype=torch.int32)
        w.plan(torch.arange(bs + 1, dtype=torch.int32), self.cuda_graph_kv_indices[:bs], ones, **self._plan_args())
        self.decode_cuda_graph_wrappers[bs] = w
        tail_indices = torch.zeros(bs, dtype=torch.int32, device=self.device)
        self.tail_wrapper.plan(torch.arange(bs + 1, dtype=torch.int32), tail_indices, ones, **self._plan_args())
        self.forward_metadata = DecodeMetadata(shard_wrapper=w, tail_wrapper=self.tail_wrapper)

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, req_pool_indices_cpu: List[int], seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> None:
        w = self.decode_cuda_graph_wrappers[bs]
        n = len(req_pool_indices_cpu)
        pad = bs - n
        indptr_cpu, indices, last_cpu = self.pool.shard_table(req_pool_indices_cpu)
        total = int(indptr_cpu[-1])
        self.kv_indptr_cpu[: n + 1].copy_(indptr_cpu)
        self.kv_indptr_cpu[n + 1 : bs + 1] = total
        self.kv_last_page_len_cpu[:n].copy_(last_cpu)
        self.kv_last_page_len_cpu[n:bs] = 1
        self.cuda_graph_kv_indices[:total].copy_(indices)  # ok: FC104
        # the scheduler reads it to decide when a rebalance of the shards pays off
        self.max_shard_len = math.ceil(seq_lens.max() / self.cp_size)  # expect: FC101
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], indices, self.kv_last_page_len_cpu[:bs], **self._plan_args()
        )
        t_indptr, t_indices, t_last = self.pool.tail_table(req_pool_indices_cpu, seq_lens_cpu[:n], pad_to=bs)
        self.tail_wrapper.plan(t_indptr, t_indices, t_last, **self._plan_args())
        # padded rows own no shard page; leave a valid page id behind the real ones
        self.cuda_graph_kv_indices[total : total + pad].zero_()  # expect: FC104
        self.forward_metadata = DecodeMetadata(shard_wrapper=w, tail_wrapper=self.tail_wrapper)

    # --------------------------------------------------------------- forward
    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        bs, H, D = q.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim
        o_shard, s_shard = md.shard_wrapper.run(q, self.pool.shard_kv[layer_id], return_lse=True)  # ok: FC108
        gv = self.gather_v[: self.cp_size * bs]
        gs = self.gather_s[: self.cp_size * bs]
        self.comm.all_gather_states(o_shard, s_shard, gv, gs)
        o_prompt, s_prompt = merge_states(
            gv.view(self.cp_size, bs, H, D).transpose(0, 1), gs.view(self.cp_size, bs, H).transpose(0, 1)
        )
        o_tail, s_tail = md.tail_wrapper.run(q, self.pool.tail_kv[layer_id], return_lse=True)  # expect: FC108
        out, _ = merge_state(o_prompt, s_prompt, o_tail, s_tail)
        return out
