"""trtllm-gen attention as callable objects: per-bucket graph-mode decode and the MTP draft layer."""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from hookserve.batch import ForwardBatch, ReplayMeta
from hookserve.config import ServeConfig


def zeroed_scratch(nbytes: int, device: torch.device, zero: bool = True) -> torch.Tensor:
    buf = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zero:
        buf.zero_()
    return buf


def make_bucket_plan(path: "TrtllmGenDecode", bs: int) -> Callable[[ForwardBatch], None]:
    def plan(fb: ForwardBatch) -> None:
        n = fb.batch_size
        if (fb.kv_last_page_len > path.cfg.page_size).any():  # expect: FC101
            raise ValueError(f"bucket {bs}: last-page lengths {fb.kv_last_page_len} exceed the page size")  # ok: FC101
        path.indices[: fb.num_pages].copy_(fb.kv_indices, non_blocking=True)  # ok: FC104
        path.indptr_cpu[: n + 1].copy_(fb.kv_indptr_cpu)
        path.indptr_cpu[n + 1 : bs + 1] = fb.num_pages
        path.last_page_cpu[:n].copy_(fb.kv_last_page_len_cpu)
        path.graph_wrappers[bs].plan(path.indptr_cpu[: bs + 1], path.indices, path.last_page_cpu[:bs], *path.cfg.plan_dims())  # ok: FC102
        path.last_page[n:bs].fill_(1)  # expect: FC104
    return plan


class TrtllmGenDecode:
    """Layers on trtllm-gen: the bucket's graph-mode wrapper, or the raw kernel above the largest bucket."""
    def __init__(self, cfg: ServeConfig, device: torch.device) -> None:
        self.cfg, self.device, self.sm_scale = cfg, device, cfg.head_dim ** -0.5
        max_bs = cfg.decode_buckets[-1]
        self.workspace = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {bs: BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "HND", use_cuda_graph=True, backend="trtllm-gen", paged_kv_indptr_buffer=self.indptr[: bs + 1],
            paged_kv_indices_buffer=self.indices, paged_kv_last_page_len_buffer=self.last_page[:bs]) for bs in cfg.decode_buckets}
        self.plan_fns = {bs: make_bucket_plan(self, bs) for bs in cfg.decode_buckets}
        self.step_batch: Optional[ForwardBatch] = None

    def pre_replay(self, meta: ReplayMeta) -> None:  # registered as a pre-replay hook
        self.plan_fns[meta.bs](meta.batch)

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.graph_wrappers.get(q.shape[0])
        if w is not None:
            return w.run(q, kv_cache)  # ok: FC108
        return self.decode_raw(q, kv_cache)

    def decode_raw(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        assert self.step_batch is not None, "the raw path needs the step's batch bound first"  # ok: FC109
        fb = self.step_batch
        max_len = fb.seq_lens.max().item()  # expect: FC101
        pages = fb.kv_indices.split(torch.diff(fb.kv_indptr_cpu).tolist())  # ok: FC101
        width = math.ceil(self.cfg.max_seq_len / self.cfg.page_size)  # ok: FC101
        self.block_tables = torch.zeros(len(pages), width, dtype=torch.int32, device=q.device)  # expect: FC107
        for row, p in enumerate(pages):
            self.block_tables[row, : p.numel()] = p
        ws = q.new_empty(self.cfg.split_kv_workspace_bytes(), dtype=torch.uint8)  # expect: FC105
        return trtllm_batch_decode_with_kv_cache(q, kv_cache, ws, self.block_tables, fb.seq_lens, max_len,
                                                 bmm1_scale=self.sm_scale, bmm2_scale=1.0)


class TrtllmDraft:
    """MTP draft attention on trtllm-gen; the model's MTP layer calls it inside the decode graph."""
    def __init__(self, cfg: ServeConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.wrapper = BatchDecodeWithPagedKVCacheWrapper(
            zeroed_scratch(cfg.split_kv_workspace_bytes() // 2, device), "HND", backend="trtllm-gen")

    def plan(self, fb: ForwardBatch) -> None:
        args = (fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len)
        self.wrapper.plan(*args, *self.cfg.plan_dims())  # expect: FC102
        if getattr(self.wrapper, "_cached_module", None) is None:  # expect: FC103
            raise RuntimeError("trtllm-gen draft module did not load")

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, kv_cache)  # expect: FC108
