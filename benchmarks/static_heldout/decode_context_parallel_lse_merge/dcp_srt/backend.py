"""FlashInfer decode over this rank's KV shard, merged across the DCP group by LSE."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from dcp.comm import DCPComm
from dcp.compat import is_graph_wrapper
from dcp.config import DCPConfig
from dcp.merge import merge_partial_states
from dcp.shard import (
    ShardPageTable,
    build_local_indptr,
    cdiv,
    gather_local_pages,
    local_last_page_len,
    local_seq_lens,
)
from dcp_srt.forward_batch import ForwardBatch


@dataclass
class DCPDecodeMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    kv_last_page_len: torch.Tensor
    q_len: int
    num_reqs: int


class DCPFlashInferBackend:
    def __init__(self, cfg: DCPConfig, comm: DCPComm, pages: ShardPageTable, kv_pool, device: torch.device):
        self.cfg = cfg
        self.comm = comm
        self.pages = pages
        self.kv_pool = kv_pool
        self.device = device
        self.rank, self.world, self.interleave = comm.rank, comm.world, cfg.interleave
        self.page_size = cfg.page_size
        self.num_local_heads = cfg.num_local_heads
        self.decode_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        verify_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        self.verify_workspace = torch.empty(cfg.verify_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.graph_workspace = torch.zeros(int(os.environ.get("DCP_GRAPH_WORKSPACE_MB", "192")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.verify_workspace, "NHD", backend=verify_backend)
        max_bs = cfg.max_bs
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_local_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.local_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[DCPDecodeMetadata] = None

    def _plan_kwargs(self) -> dict:
        cfg = self.cfg
        return dict(
            num_qo_heads=cfg.num_gathered_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---------------------------------------------------------------- eager steps
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        page = self.page_size
        local = local_seq_lens(fb.seq_lens, self.rank, self.world, self.interleave)
        local_cpu = local_seq_lens(fb.seq_lens_cpu, self.rank, self.world, self.interleave)
        max_local = int(local_cpu.max())  # ok: FC101
        self.pages.ensure(fb.req_pool_indices_cpu.tolist(), local_cpu.tolist())  # ok: FC101
        local_pages = (local + page - 1) // page
        kv_indptr = build_local_indptr(local_pages)
        rows = self.pages.req_to_page[fb.req_pool_indices, : cdiv(max_local, page)]
        cols = torch.arange(rows.shape[1], device=rows.device)
        kv_indices = rows[cols[None, :] < local_pages[:, None]]  # expect: FC101
        last_cpu = local_last_page_len(local_cpu, page)
        if fb.q_len > 1:
            local_pages_cpu = (local_cpu + page - 1) // page
            self.verify_wrapper.plan(  # ok: FC102
                fb.qo_indptr_cpu,
                build_local_indptr(local_pages_cpu),
                kv_indices,
                last_cpu,
                self.cfg.num_gathered_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                page,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        else:
            self.decode_wrapper.plan(kv_indptr, kv_indices, last_cpu, **self._plan_kwargs())  # expect: FC102
        self.forward_metadata = DCPDecodeMetadata(
            decode_wrapper=self.decode_wrapper,
            kv_last_page_len=last_cpu.to(self.device, non_blocking=True),
            q_len=fb.q_len,
            num_reqs=fb.batch_size,
        )

    # ---------------------------------------------------------------- graphs
    def _fill_graph_mirrors(self, bs: int, seq_lens_cpu: torch.Tensor) -> int:
        page = self.page_size
        local_cpu = local_seq_lens(seq_lens_cpu, self.rank, self.world, self.interleave)
        self.local_lens_host[:bs].copy_(local_cpu)
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum((local_cpu + page - 1) // page, dim=0)
        self.kv_last_page_len_cpu[:bs] = local_last_page_len(local_cpu, page)
        return int(self.kv_indptr_cpu[bs])

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_tokens: int, seq_lens_cpu: torch.Tensor) -> None:
        if self.comm._backend != "nccl":  # ok: FC103
            raise RuntimeError("DCP decode graphs capture NCCL all-gathers; the group is not on NCCL")
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        if not is_graph_wrapper(w):
            raise RuntimeError("this FlashInfer build ignores use_cuda_graph")
        self.graph_decode_wrappers[bs] = w
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        nnz = self._fill_graph_mirrors(bs, seq_lens_cpu)
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len_cpu[:bs], **self._plan_kwargs())
        self.forward_metadata = DCPDecodeMetadata(
            decode_wrapper=w,
            kv_last_page_len=self.kv_last_page_len[:bs],
            q_len=num_tokens // bs,
            num_reqs=bs,
        )

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        q_len: int,
    ) -> None:
        w = self.graph_decode_wrappers[bs]
        # host staging the output thread reads the local lengths from
        self.local_lens_host = torch.empty(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
        page = self.page_size
        local = local_seq_lens(seq_lens[:bs], self.rank, self.world, self.interleave)
        max_local = int(local.max())  # expect: FC101
        if cdiv(max_local, page) > self.cfg.max_local_pages_per_seq:
            raise ValueError(f"a request holds more than {self.cfg.max_local_pages_per_seq} pages on rank {self.rank}")
        nnz = self._fill_graph_mirrors(bs, seq_lens_cpu[:bs])
        cap = w._paged_kv_indices_buf.numel()  # expect: FC103
        if nnz > cap:
            raise RuntimeError(f"bucket {bs}: {nnz} local pages, the graph holds {cap}")
        kv_indices_dev = gather_local_pages(self.pages.req_to_page, req_pool_indices[:bs], (local + page - 1) // page, nnz)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        w.plan(self.kv_indptr_cpu[: bs + 1], kv_indices_dev, self.kv_last_page_len_cpu[:bs], **self._plan_kwargs())  # ok: FC102
        self.kv_indices[:nnz].copy_(kv_indices_dev, non_blocking=True)  # expect: FC104
        tokens = bs * q_len
        self.comm.lse_buf = torch.empty(self.world * tokens * self.cfg.num_gathered_heads, dtype=torch.float32, device=self.device)  # expect: FC107
        self.forward_metadata = DCPDecodeMetadata(
            decode_wrapper=w,
            kv_last_page_len=self.kv_last_page_len[:bs],
            q_len=q_len,
            num_reqs=bs,
        )

    # ---------------------------------------------------------------- forward
    def write_kv(self, kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        page, off = loc // self.page_size, loc % self.page_size
        kv[page, 0, off] = k
        kv[page, 1, off] = v

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch):
        kv = self.kv_pool.layer(layer_id)
        self.write_kv(kv, k, v, fb.out_cache_loc)
        meta = self.forward_metadata
        # shards that hold nothing of a request report a zero last page; the kernel wants >= 1
        meta.kv_last_page_len.clamp_(min=1)  # expect: FC104
        q_all = self.comm.all_gather_heads(q)
        if meta.q_len > 1:
            o, lse = self.verify_wrapper.run(q_all, kv, return_lse=True)  # expect: FC108
        else:
            o, lse = meta.decode_wrapper.run(q_all, kv, return_lse=True)  # ok: FC108
        outs, lses = self.comm.all_gather_states(o, lse)
        merged, merged_lse = merge_partial_states(outs, lses)
        if not torch.isfinite(merged_lse).all():  # expect: FC101
            raise RuntimeError(f"rank {self.rank}: non-finite merged LSE {merged_lse}")  # ok: FC101
        h = self.num_local_heads
        return merged[:, self.rank * h : (self.rank + 1) * h]
