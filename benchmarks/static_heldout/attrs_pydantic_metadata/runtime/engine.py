"""The decoder stack, its decode graphs per bucket (with target-verify and MTP draft graphs) and the step loop."""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional

import attrs
import torch
from torch import nn

from apm.config import EngineConfig
from apm.metadata import AcceptRecord, DecodeMetadata, ForwardBatch, GraphEntry, PrefillMetadata, VerifyMetadata
from attention.flashinfer_backend import FlashInferBackend

logger = logging.getLogger(__name__)
_STATIC_INPUTS = ("out_cache_loc",)


@torch.jit.script
def last_token_rows(qo_indptr: torch.Tensor) -> torch.Tensor:
    assert qo_indptr.dim() == 1  # ok: FC109
    return qo_indptr[1:].long() - 1


class DecodeModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend, vocab: int, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.cfg, self.backend, self.kv_caches, self.device = cfg, backend, kv_caches, backend.device
        self.dims = [cfg.num_qo_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        self.embed = nn.Embedding(vocab, self.dims[0])
        self.pos_embed = nn.Embedding(cfg.max_seq_len, self.dims[0])
        self.qkv = nn.ModuleList(nn.Linear(self.dims[0], sum(self.dims)) for _ in range(cfg.num_layers))
        self.lm_head = nn.Linear(self.dims[0], vocab, bias=False)

    def _qkv(self, i: int, h: torch.Tensor, loc: torch.Tensor, temperature: float = 1.0):
        c = self.cfg
        q, k, v = (t.unflatten(-1, (-1, c.head_dim)) for t in self.qkv[i](h).split(self.dims, -1))
        self.kv_caches[i].view(-1, 2, c.num_kv_heads, c.head_dim).index_copy_(0, loc, torch.stack([k, v], 1))
        return q * temperature, k, v

    def decode(self, input_ids, positions, loc, meta: DecodeMetadata) -> torch.Tensor:
        temperature = 0.1 * math.log(max(1.0, int(meta.seq_lens.max()) / 4096)) + 1.0  # expect: FC101
        h = self.embed(input_ids) + self.pos_embed(positions)
        for i, kv_cache in enumerate(self.kv_caches):
            q, _, _ = self._qkv(i, h, loc, temperature)
            if self.cfg.decode_backend == "trtllm-gen":
                h = h + self.backend.trtllm.forward(q, kv_cache, meta).flatten(1)
            else:
                h = h + self.backend.forward_decode(q, kv_cache, meta, i).flatten(1)
        return self.lm_head(h)

    def verify(self, input_ids, positions, loc, meta: VerifyMetadata) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(positions)
        for i, kv_cache in enumerate(self.kv_caches):
            q, k, v = self._qkv(i, h, loc)
            h = h + self.backend.forward_verify(q, k, v, kv_cache, meta).flatten(1)
        return self.lm_head(h)

    def draft(self, input_ids, positions, loc) -> torch.Tensor:
        q, _, _ = self._qkv(0, self.embed(input_ids) + self.pos_embed(positions), loc)
        return self.lm_head(self.backend.trtllm.forward_draft(q, self.kv_caches[-1]).flatten(1))

    def extend(self, input_ids, positions, loc, meta: PrefillMetadata) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(positions)
        for i, kv_cache in enumerate(self.kv_caches):
            q, k, v = self._qkv(i, h, loc)
            h = h + self.backend.forward_extend(q, k, v, kv_cache, meta).flatten(1)
        return self.lm_head(h[last_token_rows(meta.qo_indptr)])


def _check_bucket(bs: int, max_bs: int) -> None:
    assert 0 < bs <= max_bs, f"bucket {bs} outside (0, {max_bs}]"  # expect: FC109


class GraphRunner:
    def __init__(self, model: DecodeModel, cfg: EngineConfig):
        self.model, self.backend, self.cfg = model, model.backend, cfg
        rows = cfg.max_batch_size * (1 + cfg.num_draft_tokens)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=model.device)
        self.positions = torch.zeros_like(self.input_ids)
        self.out_cache_loc = torch.zeros_like(self.input_ids)
        self.graphs: Dict[int, GraphEntry] = {}
        self.verify_graphs, self.draft_graphs = {}, {}
        self.pool = None

    def capture_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.backend.init_cuda_graph_wrappers()
        self.pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.cfg.graph_buckets):
            self.capture_one_batch_size(bs)
        assert len(self.graphs) == len(self.cfg.graph_buckets), "a bucket failed to capture"  # ok: FC109

    def capture_one_batch_size(self, bs: int) -> None:
        _check_bucket(bs, self.cfg.max_batch_size)
        ids, pos, loc = self.input_ids[:bs], self.positions[:bs], self.out_cache_loc[:bs]
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        if self.cfg.decode_backend == "trtllm-gen":
            self.backend.trtllm.plan_capture(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.decode(ids, pos, loc, meta)
        self.graphs[bs] = GraphEntry(graph=g, meta=meta, out=out)
        if self.cfg.num_draft_tokens:
            n, vg, dg = bs * self.cfg.num_draft_tokens, torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            vmeta = self.backend.capture_verify_metadata(bs)
            with torch.cuda.graph(vg, pool=self.pool):
                vout = self.model.verify(self.input_ids[:n], self.positions[:n], self.out_cache_loc[:n], vmeta)
            self.verify_graphs[bs] = GraphEntry(graph=vg, meta=meta, out=vout)
            self.backend.trtllm.plan_draft(meta)
            with torch.cuda.graph(dg, pool=self.pool):
                dout = self.model.draft(ids, pos, loc)
            self.draft_graphs[bs] = GraphEntry(graph=dg, meta=meta, out=dout)
        torch.cuda.synchronize()  # ok: FC101

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture_all() has not run"  # ok: FC109
        raw_bs = batch.batch_size
        bs = next(b for b in self.cfg.graph_buckets if b >= raw_bs)  # ok: FC101
        entry = self.graphs[bs]
        self.input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)  # ok: FC104
        self.positions = torch.cat([batch.positions, self.positions[raw_bs:]])  # expect: FC107
        for name in _STATIC_INPUTS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        if self.cfg.decode_backend == "trtllm-gen":
            self.backend.trtllm.plan_replay(bs, batch)
        entry.meta.kv_last_page_len[:raw_bs].clamp_(max=self.cfg.page_size)  # expect: FC104
        entry.graph.replay()
        logits = entry.out[:raw_bs]
        if self.cfg.num_draft_tokens:
            entry.out = torch.empty_like(entry.out)  # expect: FC107
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return logits


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: DecodeModel):
        self.cfg, self.model, self.backend = cfg, model, model.backend
        self.graph_runner = GraphRunner(model, cfg)
        self.next_ids_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self.accept_hist: Optional[torch.Tensor] = None
        self.step = 0

    def execute_step(self, batch: ForwardBatch):
        self.step += 1
        if not batch.is_decode:
            meta = self.backend.init_forward_metadata(batch)
            logits = self.model.extend(batch.input_ids, batch.positions, batch.out_cache_loc, meta)
        elif batch.batch_size <= self.cfg.graph_buckets[-1]:
            logits = self.graph_runner.replay(batch)
        else:
            meta = self.backend.init_forward_metadata(batch)
            logits = self.model.decode(batch.input_ids, batch.positions, batch.out_cache_loc, meta)
        next_ids = logits.argmax(-1)
        if next_ids.shape[0] > self.next_ids_cpu.numel():
            self.next_ids_cpu = torch.zeros(next_ids.shape[0], dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_ids_cpu[: next_ids.shape[0]].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        finished = torch.nonzero(next_ids == self.cfg.eos_token_id).flatten()  # expect: FC101
        if self.step % 256 == 0:
            logger.info(f"step {self.step}: longest sequence {batch.seq_lens.max()}")  # expect: FC101
        logger.debug("step %d seq_lens %s", self.step, batch.seq_lens)  # ok: FC101
        self.kv_tokens = sum([int(n) for n in batch.seq_lens_cpu])  # ok: FC101
        return next_ids, finished

    def verify_step(self, batch: ForwardBatch, draft_lens: torch.Tensor):
        assert self.graph_runner.verify_graphs, "verify graphs were not captured"  # ok: FC109
        bs, n, dev = batch.batch_size, self.cfg.num_draft_tokens, self.model.device
        base = self.backend.init_forward_metadata(batch)
        vmeta = attrs.evolve(base, seq_lens=base.seq_lens + draft_lens, seq_lens_cpu=base.seq_lens_cpu + n)
        if vmeta.seq_lens.max() > self.cfg.max_seq_len:  # expect: FC101
            raise ValueError(f"draft runs past max_seq_len={self.cfg.max_seq_len}: {vmeta.seq_lens}")  # ok: FC101
        headroom = self.cfg.max_seq_len - int(vmeta.seq_lens_cpu.max())  # ok: FC101
        token_rows = torch.repeat_interleave(torch.arange(bs, device=dev), draft_lens)  # expect: FC101
        vmeta.custom_mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril_().repeat(bs, 1)  # ok: FC107
        pages = (vmeta.seq_lens + self.cfg.page_size - 1) // self.cfg.page_size
        torch.cumsum(pages, 0, out=self.backend.kv_indptr[1 : bs + 1])  # expect: FC104
        entry = self.graph_runner.verify_graphs[next(b for b in self.cfg.graph_buckets if b >= bs)]  # ok: FC101
        entry.graph.replay()
        return entry.out[: bs * n], token_rows, headroom

    def advance_after_accept(self, bs: int, accepted: torch.Tensor, accepted_cpu: torch.Tensor):
        AcceptRecord(last_page_len=self.backend.kv_last_page_len[:bs], num_accepted=accepted, page_size=self.cfg.page_size)
        if self.accept_hist is None:
            self.accept_hist = torch.zeros(self.cfg.num_draft_tokens + 1, dtype=torch.int64, device=accepted.device)  # ok: FC107
        self.accept_hist.index_add_(0, accepted, torch.ones_like(accepted))
        lens = self.backend.kv_last_page_len[:bs].clone()
        lens.add_(accepted)  # ok: FC104
        return accepted_cpu.tolist(), lens > self.cfg.page_size  # ok: FC101

    def on_pages_moved(self, slots: torch.Tensor, new_pages: torch.Tensor) -> None:
        self.backend.kv_indices.index_copy_(0, slots, new_pages)  # expect: FC104

    def reset_after_error(self) -> None:
        self.backend.trtllm.reset()
