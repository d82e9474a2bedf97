"""A Ray actor running one pipeline stage; each micro-batch has its own graph-mode decode wrapper."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import ray
import torch
import torch.distributed as dist
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper

from .config import StageConfig
from .functional import make_prefix_fn

logger = logging.getLogger(__name__)


@dataclass
class PPBatch:
    num_reqs: int
    seq_lens: torch.Tensor  # device
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    qo_indptr: torch.Tensor  # device
    accepted: Optional[torch.Tensor] = None


@dataclass
class MicroBatch:
    idx: int
    start: int
    num_reqs: int
    seq_lens: torch.Tensor
    max_seq_len: int
    kv_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    qo_indptr: torch.Tensor


def _check_stage(stage: int, num_stages: int) -> None:
    assert 0 <= stage < num_stages, "stage out of range"  # expect: FC109


@ray.remote(num_gpus=1)
class PPStageWorker:
    def __init__(self, stage: int, cfg: StageConfig) -> None:
        _check_stage(stage, cfg.num_stages)
        self.stage = stage
        self.cfg = cfg
        self.device = torch.device("cuda")
        m = cfg.num_microbatches
        self.workspaces = [
            torch.zeros(128 << 20, dtype=torch.uint8, device=self.device) for _ in range(m)  # expect: FC106
        ]
        self.prefix_workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.mb_kv_indptr = torch.zeros(m, cfg.max_bs_per_mb + 1, dtype=torch.int32, device=self.device)
        self.mb_last_page_len = torch.ones(m, cfg.max_bs_per_mb, dtype=torch.int32, device=self.device)
        self.kv_indices_bufs = [torch.zeros(cfg.max_pages, dtype=torch.int32, device=self.device) for _ in range(m)]
        self.accept_indptr = torch.zeros(cfg.max_bs_per_mb + 1, dtype=torch.int32, device=self.device)
        self.decode_graph_wrappers = [
            CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.workspaces[i], self.mb_kv_indptr[i], self.kv_indices_bufs[i], self.mb_last_page_len[i], "HND",
            )
            for i in range(m)
        ]
        self.prefill_wrappers = [BatchPrefillWithRaggedKVCacheWrapper(self.prefix_workspace, "NHD") for _ in range(m)]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static_q = torch.zeros(m, cfg.max_bs_per_mb, cfg.num_qo_heads, cfg.head_dim,
                                    dtype=torch.bfloat16, device=self.device)
        self.static_out = torch.zeros_like(self.static_q)
        self.kv_cache = torch.zeros(cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                                    dtype=torch.bfloat16, device=self.device)
        self.recv_buf: Optional[torch.Tensor] = None
        self.send_buf: Optional[torch.Tensor] = None
        self.recv_event = torch.cuda.Event()
        self.comm_stream = torch.cuda.Stream()

    # ------------------------------------------------------------ graphs
    def record_graphs(self, layers: list[torch.nn.Module]) -> None:
        prefix_fn = make_prefix_fn(self.prefill_wrappers[0], layers)
        for i, w in enumerate(self.decode_graph_wrappers):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = w.run(self.static_q[i], self.kv_cache)  # ok: FC108
                self.static_out[i] = out + prefix_fn(self.static_q[i], self.static_q[i], self.static_q[i])
            self.graphs[i] = g

    # ------------------------------------------------------------ per step
    def _split_microbatches(self, batch: PPBatch, n: int) -> Iterator[MicroBatch]:
        bounds = torch.linspace(0, batch.num_reqs, n + 1).round().int()
        for i, (a, b) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):  # ok: FC101
            base = batch.kv_indptr_host[a]
            indptr_host = batch.kv_indptr_host[a : b + 1] - base
            yield MicroBatch(
                idx=i,
                start=a,
                num_reqs=b - a,
                seq_lens=batch.seq_lens[a:b],
                max_seq_len=int(batch.seq_lens[a:b].max()),  # expect: FC101
                kv_indptr=indptr_host.to(self.device, non_blocking=True),
                kv_indptr_host=indptr_host,
                kv_indices=batch.kv_indices[int(base) : int(batch.kv_indptr_host[b])],  # ok: FC101
                last_page_len_host=batch.last_page_len_host[a:b],
                qo_indptr=batch.qo_indptr[a : b + 1] - batch.qo_indptr[a],
            )

    def _prepare_mb(self, mb: MicroBatch) -> None:
        cfg = self.cfg
        i, n = mb.idx, mb.num_reqs
        w = self.decode_graph_wrappers[i]
        if not getattr(w, "is_cuda_graph_enabled", True):  # ok: FC103
            raise RuntimeError("micro-batch wrapper is not in graph mode")
        if w._use_cuda_graph and n > cfg.max_bs_per_mb:  # expect: FC103
            raise ValueError(f"micro-batch of {n} exceeds max_bs_per_mb={cfg.max_bs_per_mb}")
        nnz = mb.kv_indices.numel()
        self.kv_indices_bufs[i][:nnz].copy_(mb.kv_indices, non_blocking=True)  # ok: FC104
        plan = lambda indptr, lpl: w.plan(indptr, self.kv_indices_bufs[i], lpl, cfg.num_qo_heads,  # ok: FC102
                                          cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        plan(mb.kv_indptr_host, mb.last_page_len_host)
        self.prefill_wrappers[i].plan(mb.qo_indptr, mb.kv_indptr, cfg.num_qo_heads, cfg.num_kv_heads,  # expect: FC102
                                      cfg.head_dim, causal=True)

    def _postprocess(self, mb: MicroBatch, accepted: torch.Tensor) -> torch.Tensor:
        n = mb.num_reqs
        torch.cumsum(accepted, 0, out=self.accept_indptr[1 : n + 1])  # ok: FC104
        torch.cumsum(accepted, 0, out=self.mb_kv_indptr[mb.idx][1 : n + 1])  # expect: FC104
        return self.accept_indptr[: n + 1]

    def execute_microbatches(self, batch: PPBatch, num_microbatches: int = 2) -> list[torch.Tensor]:
        assert num_microbatches >= 1  # expect: FC109
        cfg = self.cfg
        prev, nxt = self.stage - 1, self.stage + 1
        outs: list[torch.Tensor] = []
        for mb in self._split_microbatches(batch, num_microbatches):
            pages_est = math.ceil(mb.seq_lens.float().mean() / cfg.page_size)  # expect: FC101
            pages_host = math.ceil(int(mb.kv_indptr_host[-1]) / max(mb.num_reqs, 1))  # ok: FC101
            logger.debug("mb %d: ~%d pages/seq (host %d)", mb.idx, pages_est, pages_host)
            if self.recv_buf is None:
                self.recv_buf = torch.empty(cfg.max_bs_per_mb, cfg.hidden, dtype=torch.bfloat16,  # ok: FC107
                                            device=self.device)
            if prev >= 0:
                with torch.cuda.stream(self.comm_stream):
                    dist.recv(self.recv_buf[: mb.num_reqs], src=prev)
                    self.recv_event.record()
                torch.cuda.current_stream().wait_event(self.recv_event)  # ok: FC101
            if mb.num_reqs > self.static_q.shape[1]:
                self.static_q = torch.zeros(self.static_q.shape[0], mb.num_reqs, cfg.num_qo_heads,  # expect: FC107
                                            cfg.head_dim, dtype=torch.bfloat16, device=self.device)
            self._prepare_mb(mb)
            self.graphs[mb.idx].replay()
            hidden = self.static_out[mb.idx, : mb.num_reqs].flatten(1)
            hidden_out = torch.empty_like(hidden)  # ok: FC107
            hidden_out.copy_(hidden)
            self.send_buf = torch.empty_like(hidden)
            self.send_buf.copy_(hidden)
            if batch.accepted is not None:
                self._postprocess(mb, batch.accepted[mb.start : mb.start + mb.num_reqs])
            if nxt < cfg.num_stages:
                self.recv_event.synchronize()  # expect: FC101
                dist.send(self.send_buf, dst=nxt)
            outs.append(hidden_out)
        return outs

    def run_step(self, num_reqs: int, seq_lens_host: torch.Tensor, kv_indptr_host: torch.Tensor,
                 kv_indices: torch.Tensor, last_page_len_host: torch.Tensor, qo_indptr_host: torch.Tensor,
                 num_microbatches: int) -> list[torch.Tensor]:
        """Entry point the driver calls through `worker.run_step.remote(...)`."""
        batch = PPBatch(
            num_reqs=num_reqs,
            seq_lens=seq_lens_host.to(self.device, non_blocking=True),
            kv_indptr_host=kv_indptr_host,
            kv_indices=kv_indices.to(self.device, non_blocking=True),
            last_page_len_host=last_page_len_host,
            qo_indptr=qo_indptr_host.to(self.device, non_blocking=True),
        )
        return self.execute_microbatches(batch, num_microbatches)
