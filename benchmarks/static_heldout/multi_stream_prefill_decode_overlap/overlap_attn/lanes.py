"""The two lanes. Each owns its wrappers and workspaces; the prefill lane runs on the prefill
stream, the decode lane's bucket graphs replay on the decode stream."""

import math
import types
from typing import TYPE_CHECKING, Dict, List, Optional

import flashinfer
import torch

from overlap import DecodeBatch, OverlapConfig, PrefillBatch, StreamAwarePool, StreamSet
from overlap_attn.buffers import LaneBuffers
from overlap_attn.paging import pages_per_request
from overlap_attn.workspaces import StreamWorkspaces

if TYPE_CHECKING:
    from overlap_graphs.model import OverlapModel


def _run_on_stream(wrapper, stream: torch.cuda.Stream, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    with torch.cuda.stream(stream):
        if wrapper._backend == "fa3":  # expect: FC103
            q = q.contiguous()
        return wrapper.run(q, kv_cache)


def workspace_ptrs(wrappers) -> List[int]:
    """Start addresses of each wrapper's int workspace: two lanes must never share one."""
    ptrs = []
    for w in wrappers:
        ptrs.append(w._int_workspace_buffer.data_ptr())  # expect: FC103
    return ptrs


def decode_plan_kwargs(cfg: OverlapConfig) -> dict:
    return dict(
        num_qo_heads=cfg.num_qo_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        page_size=cfg.page_size,
        q_data_type=torch.bfloat16,
    )


class PrefillLane:
    def __init__(self, cfg: OverlapConfig, bufs: LaneBuffers, ws: StreamWorkspaces, streams: StreamSet,
                 pool: StreamAwarePool, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.bufs = bufs
        self.streams = streams
        self.pool = pool
        self.kv_cache = kv_cache
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws.eager["prefill"], "HND")
        self.run_on_stream = types.MethodType(_run_on_stream, self.wrapper)
        self._sm_scale = 1.0 / math.sqrt(cfg.head_dim)
        self.first_tokens_buf = None
        self.model: Optional["OverlapModel"] = None

    def attach(self, model: "OverlapModel") -> None:
        self.model = model

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.run_on_stream(self.streams.prefill, q, kv_cache)

    def launch(self, batch: PrefillBatch) -> torch.Tensor:
        c = self.cfg
        n_tok = int(batch.qo_indptr_cpu[-1])  # ok: FC101
        n_req = len(batch.request_ids)
        if sum(pages_per_request(batch.kv_lens, c.page_size)) > c.max_pages:
            raise RuntimeError("prefill batch does not fit the page budget")
        blocks = self.pool.alloc(n_tok * c.hidden_size * 2, "prefill")
        if self.first_tokens_buf is None:
            self.first_tokens_buf = torch.empty(c.max_prefill_requests, dtype=torch.int64, device=self.bufs.device)  # ok: FC107
        nnz = int(batch.kv_indptr_cpu[-1])
        with torch.cuda.stream(self.streams.prefill):
            self.bufs.kv_indices["prefill"][:nnz].copy_(batch.kv_indices_cpu, non_blocking=True)  # ok: FC104
            self.wrapper.plan(  # ok: FC102
                batch.qo_indptr_cpu,
                batch.kv_indptr_cpu,
                self.bufs.kv_indices["prefill"][:nnz],
                batch.last_page_len_cpu,
                c.num_qo_heads,
                c.num_kv_heads,
                c.head_dim,
                c.page_size,
                causal=True,
                sm_scale=self._sm_scale,  # ok: FC103
                q_data_type=torch.bfloat16,
            )
            scratch = self.pool.view(blocks, n_tok, c.hidden_size)
            logits = self.model.prefill(batch.tokens, batch.positions, self.kv_cache, scratch)
            last_rows = batch.qo_indptr_cpu[1:].to(torch.int64) - 1
            torch.argmax(logits[last_rows.to(self.bufs.device, non_blocking=True)], dim=-1,
                         out=self.first_tokens_buf[:n_req])
            self.streams.prefill_done.record(self.streams.prefill)
        self.pool.release(blocks, self.streams.prefill, "prefill")
        return self.first_tokens_buf[:n_req]


class DecodeLane:
    def __init__(self, cfg: OverlapConfig, bufs: LaneBuffers, ws: StreamWorkspaces, streams: StreamSet):
        self.cfg = cfg
        self.bufs = bufs
        self.streams = streams
        self.graph_ws = ws.graph
        self.graph_wrappers: Dict[int, flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {}
        # batches larger than the largest bucket: trtllm-gen, eager
        self.eager = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws.trtllm, "HND", backend="trtllm-gen")
        self._plan = self.eager.plan
        # requests handed over by the prefill lane decode their first token through this one
        self.handoff = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws.eager["handoff"], "HND")
        self.eager_kv_indptr = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, device=bufs.device)
        self.seq_lens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.max_seq_seen = 0

    def build_graph_wrapper(self, bs: int) -> flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper:
        w = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws,
            self.bufs.kv_indptr["decode"][: bs + 1],
            self.bufs.kv_indices["decode"],
            self.bufs.last_page_len["decode"][:bs],
            "HND",
        )
        self.graph_wrappers[bs] = w
        return w

    def _pad_rows(self, real: int, bs: int) -> None:
        self.bufs.last_page_len["decode"][real:bs].fill_(1)

    def replay(self, bs: int, batch: DecodeBatch) -> None:
        real = batch.batch_size
        nnz = int(batch.indptr_np[-1])
        ip = self.bufs.indptr_pinned["decode"]
        lp = self.bufs.last_pinned["decode"]
        ip[: real + 1].copy_(torch.from_numpy(batch.indptr_np))
        ip[real + 1 : bs + 1] = nnz
        lp[:real].copy_(torch.from_numpy(batch.last_np))
        lp[real:bs] = 1
        self.seq_lens_pinned[:real].copy_(batch.seq_lens_cpu)
        lens = self.seq_lens_pinned[:real].tolist()  # ok: FC101
        self.max_seq_seen = max(self.max_seq_seen, max(lens))
        kw = decode_plan_kwargs(self.cfg)
        with torch.cuda.stream(self.streams.decode):
            self.bufs.kv_indptr["decode"][: bs + 1].copy_(ip[: bs + 1], non_blocking=True)  # ok: FC104
            self.bufs.kv_indices["decode"][:nnz].copy_(torch.from_numpy(batch.indices_np), non_blocking=True)
            h = self.cfg.handoff_rows
            if h:
                self.handoff.plan(ip[: h + 1], self.bufs.kv_indices["decode"][:nnz], lp[:h], **kw)
            self.graph_wrappers[bs].plan(  # ok: FC102
                ip[: bs + 1], self.bufs.kv_indices["decode"][:nnz], lp[:bs], **kw
            )
            self._pad_rows(real, bs)  # expect: FC104

    def plan_eager(self, batch: DecodeBatch) -> None:
        bs = batch.batch_size
        self.eager_kv_indptr[: bs + 1].copy_(torch.from_numpy(batch.indptr_np), non_blocking=True)
        indices = torch.from_numpy(batch.indices_np).to(self.bufs.device, non_blocking=True)
        last_cpu = torch.from_numpy(batch.last_np)
        self._plan(self.eager_kv_indptr[: bs + 1], indices, last_cpu, **decode_plan_kwargs(self.cfg))  # expect: FC102

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        out = self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108
        h = self.cfg.handoff_rows
        if h:
            out[:h] = self.handoff.run(q[:h], kv_cache)  # expect: FC108
        return out

    def attend_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager.run(q, kv_cache)
