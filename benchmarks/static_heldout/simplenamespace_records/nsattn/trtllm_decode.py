"""trtllm-gen decode: graph-mode wrappers per bucket, an eager fallback and a direct kernel call
for batches larger than the largest captured bucket."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from nsattn.plan_kwargs import only_decode_params, static_decode_kwargs
from nsserve.caches import host_arange, host_ones, workspace_for, zeroed_workspace_for
from nsserve.config import split_kv_workspace_bytes
from nsserve.records import make_meta

logger = logging.getLogger(__name__)


class TrtllmDecodePath:
    # Every wrapper of this path runs the trtllm-gen kernels.
    WRAPPER_KW = {"backend": "trtllm-gen"}

    def __init__(self, cfg: SimpleNamespace, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.max_graph_bs = cfg.graph_batch_sizes[-1] if cfg.graph_batch_sizes else 0
        nbytes = split_kv_workspace_bytes(cfg)
        # Graph wrappers share the process-wide workspace of their kind.
        self.workspace = workspace_for("trtllm", nbytes, device)
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            zeroed_workspace_for("trtllm-eager", nbytes, device), cfg.kv_layout, **self.WRAPPER_KW
        )
        # The eager fallback must never take the fixed-batch graph kernels, whatever the factory did.
        for key, value in {"_use_cuda_graph": False, "_fixed_batch_size": 0}.items():
            setattr(self.eager_wrapper, key, value)  # expect: FC103

        max_bs = max(self.max_graph_bs, 1)
        self.bufs = SimpleNamespace(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
        )
        self.host = SimpleNamespace(
            kv_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            kv_last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        )
        # Oversize batches call the kernel directly with their own scratch.
        self.direct = SimpleNamespace(
            workspace=torch.empty(nbytes, dtype=torch.uint8, device=device),  # expect: FC105
            block_tables=None,
        )
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._plan_static = static_decode_kwargs(cfg)
        self.bmm1_scale = cfg.head_dim**-0.5

    # ------------------------------------------------------------------ graph buckets
    def init_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        kw = dict(
            self.WRAPPER_KW,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.bufs.kv_indices,
            paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs],
        )
        w = self.graph_wrappers.get(bs)
        if w is None:
            w = self.graph_wrappers.setdefault(bs, BatchDecodeWithPagedKVCacheWrapper(self.workspace, self.cfg.kv_layout, **kw))
        return w

    def capture_bucket_metadata(self, bs: int, rec: SimpleNamespace) -> SimpleNamespace:
        w = self.init_bucket(bs)
        # Capture dummies: one page per request.
        plan_rec = SimpleNamespace(indptr=host_arange(bs + 1), indices=self.bufs.kv_indices[:bs], last_page_len=host_ones(bs))
        w.plan(**vars(plan_rec), **self._plan_static)
        return make_meta(**vars(rec), wrapper=w)

    def refresh_bucket(self, bs: int, step: SimpleNamespace) -> SimpleNamespace:
        """Point the captured bucket ``bs`` at this step's batch (fills, then plans)."""
        n, nnz = step.batch_size, step.kv_nnz
        host = self.host
        host.kv_indptr_cpu[: n + 1].copy_(step.kv_indptr_cpu)
        host.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        host.kv_last_page_len_cpu[:n].copy_(step.kv_last_page_len_cpu)
        host.kv_last_page_len_cpu[n:bs] = 1
        self.bufs.kv_indices[:nnz].copy_(step.kv_indices, non_blocking=True)  # ok: FC104
        kw = {
            **self._plan_static,
            "indptr": host.kv_indptr_cpu[: bs + 1],
            "indices": self.bufs.kv_indices[:nnz],
            "last_page_len": host.kv_last_page_len_cpu[:bs],
            "non_blocking": True,
            "block_tables_hint": None,
        }
        w = self.graph_wrappers[bs]
        w.plan(**only_decode_params(kw))  # ok: FC102
        return make_meta(**vars(step), wrapper=w)

    # ------------------------------------------------------------------ eager
    def plan_eager(self, meta: SimpleNamespace) -> SimpleNamespace:
        host_kw = {"indptr": meta.kv_indptr_cpu, "last_page_len": meta.kv_last_page_len_cpu}
        self.eager_wrapper.plan(indices=meta.kv_indices, **host_kw, **self._plan_static)
        meta.wrapper = self.eager_wrapper
        return meta

    def forward(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        if meta.batch_size > self.max_graph_bs:
            return self.forward_direct(q, kv_cache, meta)
        w = meta.wrapper or self.eager_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_direct(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        d = self.direct
        n, nnz = meta.batch_size, meta.kv_nnz
        if d.block_tables is None:
            d.block_tables = torch.zeros(  # ok: FC107
                self.cfg.max_batch_size, self.cfg.max_pages_per_req, dtype=torch.int32, device=self.device
            )
        bt = d.block_tables[:n]
        bt.zero_()
        pages = meta.kv_indptr[1:] - meta.kv_indptr[:-1]
        rows = torch.repeat_interleave(torch.arange(n, device=self.device), pages, output_size=nnz)
        cols = torch.arange(nnz, device=self.device) - torch.repeat_interleave(meta.kv_indptr[:-1], pages, output_size=nnz)
        bt[rows, cols] = meta.kv_indices
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=d.workspace,
            block_tables=bt,
            seq_lens=meta.seq_lens,
            max_seq_len=self.cfg.max_context_len,
            bmm1_scale=self.bmm1_scale,
            bmm2_scale=1.0,
        )
