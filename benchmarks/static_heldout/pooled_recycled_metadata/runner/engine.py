"""Decoder stack, per-bucket decode graphs over pooled buffers, and the step loop that recycles its metadata."""

from __future__ import annotations

import collections
import logging
from typing import List, Tuple

import flashcheck
import torch
from torch import nn

from attn.backend import FlashInferBackend
from poolserve.config import ServeConfig
from poolserve.metadata import ForwardBatch, StepMetadata

logger = logging.getLogger(__name__)


@torch.jit.script
def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    assert cap > 0.0  # ok: FC109
    return cap * torch.tanh(logits / cap)


class DecodeModel(nn.Module):
    def __init__(self, cfg: ServeConfig, backend: FlashInferBackend, vocab: int, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.cfg, self.backend, self.kv_caches = cfg, backend, kv_caches
        self.dims = [cfg.num_qo_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        self.embed, self.pos = nn.Embedding(vocab, self.dims[0]), nn.Embedding(1 << 17, self.dims[0])
        self.qkv = nn.ModuleList(nn.Linear(self.dims[0], sum(self.dims)) for _ in range(cfg.num_layers))
        self.lm_head = nn.Linear(self.dims[0], vocab, bias=False)

    def _qkv(self, i: int, h: torch.Tensor, loc: torch.Tensor):
        c = self.cfg
        q, k, v = (t.unflatten(-1, (-1, c.head_dim)) for t in self.qkv[i](h).split(self.dims, -1))
        self.kv_caches[i].view(-1, 2, c.num_kv_heads, c.head_dim).index_copy_(0, loc, torch.stack([k, v], 1))
        return q, k, v

    def decode(self, input_ids, positions, loc, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos(positions)
        if meta.custom_mask.any():  # expect: FC101
            h = h.masked_fill(meta.custom_mask[: h.shape[0], None], 0.0)  # ok: FC101
        for i, kv_cache in enumerate(self.kv_caches):
            q, _, _ = self._qkv(i, h, loc)
            if self.cfg.decode_backend == "trtllm-gen":
                h = h + self.backend.trtllm.forward(q, kv_cache, meta).flatten(1)
            else:
                h = h + self.backend.forward_decode(q, kv_cache, meta, i).flatten(1)
        return soft_cap(self.lm_head(h), 30.0)

    def decode_overflow(self, input_ids, positions, loc, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos(positions)
        trtllm = self.cfg.decode_backend == "trtllm-gen"
        for i, kv_cache in enumerate(self.kv_caches):
            q = self._qkv(i, h, loc)[0]
            o = self.backend.trtllm.decode_direct(q, kv_cache, meta) if trtllm else self.backend.decode_wrapper.run(q, kv_cache)  # ok: FC108
            h = h + o.flatten(1)
        return soft_cap(self.lm_head(h), 30.0)

    def extend(self, input_ids, positions, loc) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos(positions)
        for i in range(len(self.kv_caches)):
            h = h + self.backend.ragged_wrapper.run(*self._qkv(i, h, loc)).flatten(1)  # ok: FC108
        return soft_cap(self.lm_head(h), 30.0)

    def draft(self, input_ids, positions, loc) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos(positions)
        h = h + self.backend.draft_extend_wrapper.run(*self._qkv(0, h, loc)).flatten(1)  # expect: FC108
        q, _, _ = self._qkv(0, h, loc)
        return soft_cap(self.lm_head(h + self.backend.trtllm.forward_draft(q, self.kv_caches[0]).flatten(1)), 30.0)


def _bucket_for(raw_bs: int, buckets: Tuple[int, ...]) -> int:
    assert raw_bs <= buckets[-1], f"{raw_bs} rows exceed the largest bucket {buckets[-1]}"  # expect: FC109
    return next(b for b in buckets if b >= raw_bs)  # ok: FC101


class GraphRunner:
    def __init__(self, model: DecodeModel, cfg: ServeConfig):
        self.model, self.backend, self.cfg = model, model.backend, cfg
        self.stream = torch.cuda.Stream()
        self._plan_info = collections.Counter()  # replays per bucket, exported as a metric

    def capture(self) -> None:
        self.backend.init_graph_state()
        for bs in reversed(self.cfg.graph_buckets):
            self.capture_one_batch_size(bs)
        assert self.backend.records, "no bucket was captured"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int) -> None:
        rec = self.backend.records[bs]
        rec.input_ids = torch.zeros(bs, dtype=torch.int64, device=self.backend.device)  # ok: FC107
        rec.positions, rec.loc = torch.zeros_like(rec.input_ids), torch.zeros_like(rec.input_ids)
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        if self.cfg.decode_backend == "trtllm-gen":
            self.backend.trtllm.plan_capture(bs)
        self.stream.synchronize()  # ok: FC101
        rec.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(rec.graph, stream=self.stream):
            rec.out = self.model.decode(rec.input_ids, rec.positions, rec.loc, meta)
        if self.cfg.num_draft_tokens:
            qo_indptr_cpu = torch.arange(bs + 1, dtype=torch.int32) * (1 + self.cfg.num_draft_tokens)
            self.backend.draft_extend_wrapper.plan(qo_indptr_cpu, qo_indptr_cpu, *self.cfg.plan_dims()[:3])  # ok: FC102
            self.backend.trtllm.plan_draft(meta)
            rec.draft_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(rec.draft_graph, stream=self.stream):
                rec.draft_out = self.model.draft(rec.input_ids, rec.positions, rec.loc)

    def replay(self, batch: ForwardBatch):
        raw_bs = batch.batch_size
        bs = _bucket_for(raw_bs, self.cfg.graph_buckets)
        rec = self.backend.records[bs]
        rec.input_ids = torch.cat([batch.input_ids, rec.input_ids[raw_bs:]])  # expect: FC107
        rec.positions = batch.positions.clone()  # expect: FC107
        rec.loc[:raw_bs].copy_(batch.out_cache_loc)
        meta = self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        if self.cfg.decode_backend == "trtllm-gen":
            self.backend.trtllm.plan_bucket(bs, batch)
        logger.debug(f"replay bucket {bs} for {raw_bs} rows, longest {batch.seq_lens.max()}")  # expect: FC101
        rec.graph.replay()
        self._plan_info[bs] += 1  # ok: FC103
        if self.cfg.num_draft_tokens:
            self.backend.trtllm.plan_draft(meta)
            rec.draft_graph.replay()
        return rec.out[:raw_bs], meta


class Engine:
    def __init__(self, cfg: ServeConfig, model: DecodeModel):
        self.cfg, self.model, self.backend = cfg, model, model.backend
        self.graphs = GraphRunner(model, cfg)
        self.out_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.accepted_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.scratch = self.backend.pool.acquire(cfg.max_num_tokens)

    @flashcheck.hot_path
    def step(self, batch: ForwardBatch):
        if not batch.is_decode:
            meta = self.backend.init_forward_metadata(batch)
            logits = self.model.extend(batch.input_ids, batch.positions, batch.out_cache_loc)
        elif batch.batch_size <= self.cfg.graph_buckets[-1]:
            logits, meta = self.graphs.replay(batch)
        else:
            meta = self.backend.init_forward_metadata(batch)
            logits = self.model.decode_overflow(batch.input_ids, batch.positions, batch.out_cache_loc, meta)
        next_ids = logits.argmax(-1)
        n = next_ids.shape[0]
        if n > self.out_cpu.numel():
            self.out_cpu = torch.zeros(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.out_cpu[:n].copy_(next_ids)  # expect: FC101
        finished = torch.nonzero(next_ids == self.cfg.eos_token_id).flatten()  # expect: FC101
        logger.debug("step done: finished rows %s", finished)  # ok: FC101
        self.backend.meta_pool.release(meta)
        return self.out_cpu[:n].tolist(), finished  # ok: FC101

    @flashcheck.hot_path
    def after_accept(self, bs: int, accepted: torch.Tensor) -> int:
        rec = self.backend.records[bs]
        rec.kv_last_page_len[: accepted.shape[0]] += accepted  # expect: FC104
        spill = rec.kv_last_page_len.clone()
        spill.sub_(self.cfg.page_size).clamp_(min=0)  # ok: FC104
        self.accepted_cpu[: accepted.shape[0]].copy_(accepted, non_blocking=True)  # ok: FC101
        if spill.shape[0] != bs:
            raise RuntimeError(f"bucket {bs} spill rows {spill}")  # ok: FC101
        return int(accepted.sum())  # expect: FC101

    def compact_pages(self, bs: int, pages_per_req: torch.Tensor) -> None:
        torch.cumsum(pages_per_req, 0, out=self.backend.records[bs].kv_indptr[1:])  # expect: FC104

    def trim_buckets(self, keep: int) -> None:
        for bs in self.cfg.graph_buckets[keep:]:
            self.backend.pool.release(self.backend.records[bs].kv_indices, scrub=True)  # expect: FC104
        self.backend.pool.release(self.scratch, scrub=True)  # ok: FC104
        self.scratch = self.backend.pool.acquire(self.cfg.max_num_tokens // 2)
        self.backend.wrapper_pool.shrink(keep=1)
