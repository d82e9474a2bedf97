"""FlashInfer attention for the asyncio engine: per-group plans awaited together, graph-mode wrappers per bucket."""

from __future__ import annotations

import asyncio
import functools
import operator
import os
from typing import Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, merge_state_in_place
from flashinfer.decode import fast_decode_plan

from aiostep import EXTEND_WORKSPACE_BYTES, EngineConfig, ScheduledBatch, last_page_lens
from aiostep import scratch_workspace, zeroed_workspace
from aiostep.config import _WS_MB

_PRIVATE_BUFS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")
U8 = torch.uint8


class AsyncFlashInferBackend:
    PREFILL_WS_BYTES = 256 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.dims = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self._backend = "fa2"  # ok: FC103
        self._sm_scale = cfg.head_dim**-0.5
        self._plan_info: dict[int, tuple[int, int]] = {}  # ok: FC103
        self.decode_backend = "trtllm-gen" if cfg.use_trtllm_decode else "fa2"
        self.window_planned, self.last_plan_info = False, None
        float_ws = torch.empty(cfg.split_kv_workspace_bytes(), dtype=U8, device=device)  # ok: FC105
        window_ws = torch.zeros(_WS_MB["window"] << 20, dtype=U8, device=device)  # expect: FC106
        softcap_ws = torch.zeros(int(os.getenv("AIOSTEP_SOFTCAP_WS_MB", "64")) << 20, dtype=U8, device=device)  # expect: FC106
        ragged_ws = torch.zeros(self.PREFILL_WS_BYTES, dtype=U8, device=device)  # expect: FC106
        extend_ws = torch.zeros(EXTEND_WORKSPACE_BYTES, dtype=U8, device=device)  # expect: FC106
        sink_ws = torch.zeros(cfg.sink_workspace_bytes, dtype=U8, device=device)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(float_ws, "NHD")
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(window_ws, "NHD")
        self.softcap_wrapper = BatchDecodeWithPagedKVCacheWrapper(softcap_ws, "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD")
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(extend_ws, "NHD")
        self.sink_wrapper = BatchDecodeWithPagedKVCacheWrapper(sink_ws, "NHD")
        draft_ws = scratch_workspace(cfg.draft_workspace_bytes, str(device))
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_ws, "HND", backend="trtllm-gen")
        self._window_plan = functools.partial(self.window_wrapper.plan, window_left=cfg.window_size - 1)
        self._draft_plan = fast_decode_plan
        max_bs = max(cfg.graph_buckets)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_ws = zeroed_workspace(cfg.split_kv_workspace_bytes(), device)
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.extend_positions: Optional[torch.Tensor] = None
        self.sinks = torch.zeros(cfg.num_qo_heads, dtype=torch.float32, device=device)

    def init_graph_buffers(self) -> None:
        self.kv_indptr_buf.zero_()  # ok: FC104
        self.kv_indices_buf.zero_()  # ok: FC104
        self.kv_last_page_buf.fill_(1)  # ok: FC104

    def warmup_kernels(self) -> None:
        indptr, last = torch.tensor([0, 1], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
        indices = torch.zeros(1, dtype=torch.int32, device=self.device)
        plan = self.decode_wrapper.plan
        plan(indptr, indices, last, *self.dims)  # ok: FC102
        self._draft_plan(self.draft_wrapper, indptr, indices, last, *self.dims)  # ok: FC102
        for w in (self.decode_wrapper, self.window_wrapper, self.softcap_wrapper):
            if getattr(w, "_cached_module", None) is None:  # expect: FC103
                raise RuntimeError(f"decode module of {type(w).__name__} was not compiled")

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf, paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs],
            backend=self.decode_backend,
        )
        self.graph_wrappers[bs] = w
        self.kv_indptr_buf[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        self.kv_last_page_buf[:bs].fill_(1)  # ok: FC104
        w.plan(self.kv_indptr_buf[: bs + 1], self.kv_indices_buf, self.kv_last_page_buf[:bs], *self.dims)  # expect: FC102

    async def init_forward_metadata(self, batch: ScheduledBatch) -> None:
        assert batch.batch_size <= self.cfg.max_batch, "batch exceeds max_batch"  # expect: FC109
        if batch.kv_indptr_cpu[0] != 0:
            raise ValueError(f"kv_indptr must start at 0, got {batch.kv_indptr[:4]}")  # ok: FC101
        if not batch.is_decode:
            return await self._plan_extend(batch)
        groups = list(self.cfg.layer_groups)
        if not (batch.seq_lens > self.cfg.window_size).any():  # expect: FC101
            groups.remove("window")  # every request fits its window: window layers reuse the full plan
        self.window_planned = "window" in groups
        await asyncio.gather(*(self._plan_group(g, batch) for g in groups))

    async def _plan_group(self, group: str, batch: ScheduledBatch) -> None:
        if group == "window":
            indptr, indices, last = self._window_page_table(batch)
            self._window_plan(indptr, indices, last, *self.dims)  # expect: FC102
        elif group == "softcap":
            await asyncio.to_thread(  # ok: FC102
                self.softcap_wrapper.plan, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu,
                *self.dims, logits_soft_cap=self.cfg.logits_soft_cap,
            )
        elif group == "sink":
            self.sink_wrapper.begin_forward(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, *self.dims)  # expect: FC102
        else:
            self.decode_wrapper.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, *self.dims)  # expect: FC102

    def _window_page_table(self, batch: ScheduledBatch):
        """Sliding-window page table, derived on the device from the full one."""
        page, n = self.cfg.page_size, batch.batch_size
        first = torch.clamp(batch.seq_lens - self.cfg.window_size, min=0) // page
        pages = (batch.seq_lens + page - 1) // page - first
        indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(pages, 0, out=indptr[1:])
        nnz = int(indptr[-1])  # expect: FC101
        req = torch.repeat_interleave(torch.arange(n, device=self.device), pages, output_size=nnz)  # ok: FC101
        offs = torch.arange(nnz, device=self.device) - indptr[req] + first[req]
        return indptr, batch.kv_indices[batch.kv_indptr[req] + offs], last_page_lens(batch.seq_lens, page)

    async def _plan_extend(self, batch: ScheduledBatch) -> None:
        extend_lens = batch.qo_indptr[1:] - batch.qo_indptr[:-1]
        token_req = torch.repeat_interleave(torch.arange(batch.batch_size, device=self.device), extend_lens)  # expect: FC101
        self.extend_positions = torch.empty(batch.num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        tok = torch.arange(batch.num_tokens, device=self.device)
        torch.add((batch.seq_lens - extend_lens)[token_req], tok - batch.qo_indptr[token_req], out=self.extend_positions)
        self.ragged_wrapper.plan(batch.qo_indptr, batch.qo_indptr, *self.dims[:3], causal=True)  # expect: FC102
        self.extend_wrapper.plan(  # ok: FC102
            batch.qo_indptr_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.dims
        )

    async def plan_draft(self, batch: ScheduledBatch) -> None:
        draft_last_gpu = torch.clamp(batch.kv_last_page_len + 1, max=self.cfg.page_size)
        self._draft_plan(self.draft_wrapper, batch.kv_indptr_cpu, batch.kv_indices, draft_last_gpu, *self.dims)  # expect: FC102

    def _check_bucket(self, bs: int) -> None:
        assert bs in self.graph_wrappers, "bucket was never captured"  # expect: FC109

    async def stage_bucket(self, bs: int, batch: ScheduledBatch) -> None:
        """Before a replay: fill the bound buffers, then await every plan the recorded graph reads."""
        self._check_bucket(bs)
        n = batch.batch_size
        nnz = int(batch.kv_indptr_cpu[n])
        self.kv_indptr_host[: n + 1].copy_(batch.kv_indptr_cpu)  # ok: FC101
        self.kv_indptr_buf[: n + 1].copy_(batch.kv_indptr, non_blocking=True)  # ok: FC104
        self.kv_indices_buf[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        groups = ("window", "softcap", "sink")
        await asyncio.gather(self._plan_bucket(bs, batch), *(self._plan_group(g, batch) for g in groups), self.plan_draft(batch))
        self.kv_last_page_buf[n:bs].fill_(1)  # expect: FC104

    async def _plan_bucket(self, bs: int, batch: ScheduledBatch) -> None:
        n = batch.batch_size
        nnz = int(self.kv_indptr_host[n])
        w = self.graph_wrappers[bs]
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.kv_last_page_host[:n].copy_(batch.kv_last_page_len_cpu)
        self.kv_last_page_buf[:n].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        w.plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.kv_last_page_host[:bs], *self.dims)  # ok: FC102
        self.kv_indptr_buf[n + 1 : bs + 1].fill_(nnz)  # expect: FC104
        self._plan_info[bs] = (n, nnz)  # ok: FC103
        self.last_plan_info = w._plan_info  # expect: FC103

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, kind: str, bs: int) -> torch.Tensor:
        """Recorded per bucket: full layers run on the bucket's graph-mode wrapper."""
        if kind == "window":
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if kind == "softcap":
            return self.softcap_wrapper.run(q, kv_cache)  # expect: FC108
        if kind == "sink":
            return self.sink_wrapper.run(q, kv_cache, sinks=self.sinks)  # expect: FC108
        return self.graph_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        self.kv_last_page_buf[:bs].add_(1)  # expect: FC104
        return self.draft_wrapper.run(q, kv_cache)  # expect: FC108

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor, kind: str) -> torch.Tensor:
        if kind == "sink":
            return self.sink_wrapper.run(q, kv_cache, sinks=self.sinks)
        eager = {"window": self.window_wrapper if self.window_planned else None, "softcap": self.softcap_wrapper}
        return (eager.get(kind) or self.decode_wrapper).run(q, kv_cache)  # ok: FC108

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor, batch: ScheduledBatch) -> torch.Tensor:
        out, lse = self.ragged_wrapper.run_return_lse(q, q, q)  # ok: FC108
        prefix_out, prefix_lse = self.extend_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        batch.scratch = torch.empty_like(out)  # ok: FC107
        merge_state_in_place(batch.scratch.copy_(out), lse, prefix_out, prefix_lse)
        return batch.scratch

    def workspace_stats(self) -> dict[str, int]:
        graph_int = list(map(operator.attrgetter("_int_workspace_buffer"), self.graph_wrappers.values()))  # expect: FC103
        float_bytes = self.decode_wrapper._float_workspace_buffer.numel()  # expect: FC103
        return {"graph_int_bytes": sum(t.numel() for t in graph_int), "decode_float_bytes": float_bytes}

    def debug_dump(self, bs: int) -> dict[str, list[int]]:
        w = self.graph_wrappers[bs]
        bufs = {name: getattr(w, name) for name in _PRIVATE_BUFS}  # expect: FC103
        return {name: buf.cpu().tolist() for name, buf in bufs.items()}  # ok: FC101
