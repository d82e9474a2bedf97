"""Scheduler + runner: cache hits shorten each prompt's prefill."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from pcache import NULL_BLOCK_ID, BlockHash, BlockPool, KVBlock, PrefixCacheConfig, hash_request_blocks
from pc_attn.backend import PrefixCacheBackend
from pc_attn.block_table import BlockTable
from pc_attn.builder import PrefixMetadataBuilder
from pc_attn.metadata import StepBatch
from pc_run.graph_runner import DecodeGraphRunner
from pc_run.model import PrefixDecoder


@dataclass
class Request:
    token_ids: List[int]
    slot: int
    extra: str
    hashes: List[BlockHash] = field(default_factory=list)
    blocks: List[KVBlock] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0


def _pinned(values, dtype=torch.int32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).pin_memory()


class PrefixCacheEngine:
    def __init__(self, cfg: PrefixCacheConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.pool = BlockPool(cfg.num_blocks, device)
        self.block_table = BlockTable(cfg.max_num_seqs, cfg.max_blocks_per_seq, device)
        self.backend = PrefixCacheBackend(cfg, self.block_table, device)
        self.builder = PrefixMetadataBuilder(cfg, self.block_table, self.pool, device)
        shape = (cfg.num_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.model = PrefixDecoder(cfg, self.backend, self.kv_caches).to(device)
        self.graph_runner = DecodeGraphRunner(self.model, self.backend, cfg, device)
        for bs in sorted(cfg.graph_buckets, reverse=True):
            self.graph_runner.capture_one_batch_size(bs)
        self.running: Dict[str, Request] = {}
        self.free_slots = list(range(cfg.max_num_seqs))

    def add_request(self, rid: str, token_ids: List[int], extra: str = "") -> None:
        bs = self.cfg.block_size
        req = Request(list(token_ids), self.free_slots.pop(), extra)
        req.hashes = hash_request_blocks(req.token_ids, bs, extra)
        hits = self.pool.lookup(req.hashes)
        if len(hits) * bs >= len(req.token_ids):  # the last prompt token is always computed
            hits = hits[:-1]
        self.pool.touch(hits)
        req.blocks = hits + self.pool.allocate(-(-len(req.token_ids) // bs) - len(hits))
        req.num_cached = req.num_computed = len(hits) * bs
        self.running[rid] = req

    def _schedule(self) -> StepBatch:
        reqs = sorted(self.running.values(), key=lambda r: len(r.token_ids) - r.num_computed)
        n_dec = sum(1 for r in reqs if r.num_computed == len(r.token_ids) - 1)
        ids, pos, q_lens, prefix, new_rows = [], [], [], [], {}
        for r in reqs:
            ids.extend(r.token_ids[r.num_computed :])
            pos.extend(range(r.num_computed, len(r.token_ids)))
            q_lens.append(len(r.token_ids) - r.num_computed)
            prefix.append(r.num_cached if q_lens[-1] > 1 else 0)
            if len(r.blocks) * self.cfg.block_size < len(r.token_ids):
                r.blocks += self.pool.allocate(1)
            new_rows[r.slot] = [b.block_id for b in r.blocks]
        prefix_np = np.asarray(prefix, dtype=np.int32)
        shared = 0  # leading blocks every decode row shares (a cached system prompt)
        if reqs and n_dec == len(reqs):
            rows = [r.blocks for r in reqs]
            while shared < min(map(len, rows)) - 1 and all(b[shared] is rows[0][shared] for b in rows):
                shared += 1
        return StepBatch(
            num_reqs=len(reqs),
            num_decodes=n_dec,
            slots=[r.slot for r in reqs],
            input_ids=_pinned(ids, torch.int64).to(self.device, non_blocking=True),
            positions=_pinned(pos, torch.int64).to(self.device, non_blocking=True),
            query_lens_cpu=_pinned(q_lens),
            seq_lens_cpu=_pinned([len(r.token_ids) for r in reqs]),
            prefix_lens_np=prefix_np,
            prefix_lens=torch.from_numpy(prefix_np).to(self.device, non_blocking=True),
            shared_prefix_blocks=shared,
            new_rows=new_rows,
        )

    def step(self) -> torch.Tensor:
        batch = self._schedule()
        meta = self.builder.build(batch)
        slots = _pinned(batch.slots, torch.int64).to(self.device, non_blocking=True)
        decode_only = batch.num_decodes == batch.num_reqs
        if decode_only and batch.num_reqs <= self.cfg.max_graph_bs:
            logits = self.graph_runner.replay(meta, batch.input_ids, batch.positions, slots)
        else:
            self.backend.init_forward_metadata(meta)
            run = self.model.forward_decode if decode_only else self.model.forward_mixed
            logits = run(batch.input_ids, batch.positions, slots)
        evicted, self.pool.evicted_since_step = self.pool.evicted_since_step, []
        self._scrub_evicted(evicted)
        for r in self.running.values():
            r.num_computed = len(r.token_ids)
            r.hashes = hash_request_blocks(r.token_ids, self.cfg.block_size, r.extra)
            self.pool.cache_full_blocks(r.blocks, r.hashes)
        return logits.argmax(dim=-1)

    def _scrub_evicted(self, evicted: List[int]) -> None:
        if evicted:
            ev = _pinned(evicted).to(self.device, non_blocking=True)
            stale = torch.isin(self.backend.kv_indices_buf, ev)
            self.backend.kv_indices_buf.masked_fill_(stale, NULL_BLOCK_ID)  # expect: FC104

    def finish(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.pool.free(req.blocks)
        self.free_slots.append(req.slot)

    def cache_report(self) -> Dict[str, float]:
        hits = self.pool.hit_tokens_dev.item()  # ok: FC101
        ws = self.backend.prefill_wrapper._float_workspace_buffer.numel()  # expect: FC103
        return {"hit_rate": hits / max(1, self.pool.query_tokens_dev.item() + hits), "prefill_ws": float(ws)}
