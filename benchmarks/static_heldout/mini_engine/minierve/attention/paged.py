import functools
import os

import torch
from torch import empty as E
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper

SCRATCH_BYTES = int(os.environ.get("MINIERVE_SCRATCH_BYTES", 256 * 1024 * 1024))


def fill_indptr(buf, lens):
    n = lens.shape[0]
    buf[1 : n + 1] = torch.cumsum(lens, 0)


class PagedDecodeBackend:
    def __init__(self, cfg, device):
        self.cfg = cfg
        self.device = device
        self.buckets = (1, 2, 4, 8, 16, 32)
        max_bs = self.buckets[-1]
        self.scratch = torch.empty(SCRATCH_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.int_workspace = E(8 * 1024 * 1024, dtype=torch.uint8, device=device)  # expect: FC106
        self.float_ws = E(cfg.max_tokens * cfg.num_heads * cfg.head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC106
        self.indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.decoders = {bs: BatchDecodeWithPagedKVCacheWrapper(self.scratch, "NHD") for bs in self.buckets}
        self.graph_decoders = {}
        for bs in self.buckets:
            self.graph_decoders[bs] = CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.float_ws, self.indptr[: bs + 1], self.indices, self.last_page_len[:bs], "NHD"
            )

    def plan_decode(self, bs, lens_cpu):
        fill_indptr(self.indptr_cpu, lens_cpu)
        self.indptr[: bs + 1].copy_(self.indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        planner = functools.partial(self.graph_decoders[bs].plan, num_qo_heads=self.cfg.num_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim, page_size=self.cfg.page_size)
        planner(self.indptr_cpu[: bs + 1], self.indices, self.last_page_len_cpu[:bs])  # ok: FC102

    def plan_eager(self, bs, lens):
        eager_plan = functools.partial(self.decoders[bs].plan, num_qo_heads=self.cfg.num_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim, page_size=self.cfg.page_size)
        fill_indptr(self.indptr, lens)
        eager_plan(self.indptr[: bs + 1], self.indices, self.last_page_len[:bs])  # expect: FC102

    def advance(self, lens):
        fill_indptr(self.indptr, lens + 1)  # expect: FC104

    def decode_graph(self, bs, q, kv):
        return self.graph_decoders[bs].run(q, kv)  # ok: FC108

    def decode_eager(self, bs, q, kv):
        return self.decoders[bs].run(q, kv)  # expect: FC108

    def plan_statistics(self):
        return {"max_len": int(self.last_page_len.max().item()), "total": int(self.indptr[-1])}  # ok: FC101
