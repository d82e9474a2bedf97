"""The serving loop: schedule, prefetch pages, stage metadata, replay or run eager."""

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

from kvtier.config import TierConfig
from kvtier.page_table import TieredPageTable
from kvtier.tools.nvme_io import NvmeStore
from kvtier_engine.attention import TieredAttention
from kvtier_engine.graph_runner import DecodeGraphRunner
from kvtier_engine.prefetcher import AsyncPrefetcher

logger = logging.getLogger(__name__)


@dataclass
class StepBatch:
    num_decode: int
    page_ids_np: np.ndarray
    page_counts_np: np.ndarray
    decode_indptr_np: np.ndarray
    decode_last_np: np.ndarray
    staged_indptr_np: np.ndarray
    page_ids_dev: torch.Tensor
    decode_positions_dev: torch.Tensor
    decode_slots_dev: torch.Tensor
    staged_slots_dev: torch.Tensor
    input_ids_dev: torch.Tensor
    positions_dev: torch.Tensor
    extend_qo_indptr_host: Optional[torch.Tensor] = None
    extend_last_host: Optional[torch.Tensor] = None
    page_counts_dev: Optional[torch.Tensor] = None


class TieredModel(nn.Module):
    def __init__(self, cfg: TierConfig, attn: TieredAttention):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.embed = nn.Embedding(128256, cfg.num_qo_heads * cfg.head_dim)
        self.qkv = nn.ModuleList(
            [nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.num_qo_heads * cfg.head_dim) for _ in range(cfg.num_layers)]
        )
        self.staged = {layer: i for i, layer in enumerate(cfg.staged_layers)}

    def decode_body(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, proj in enumerate(self.qkv):
            q = proj(h).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
            if layer in self.staged:
                o = self.attn.forward_staged(q, self.staged[layer])
            else:
                o = self.attn.forward_decode(q, layer, bs)
            h = h + o.reshape(bs, -1)
        return h


@dataclass
class Sequence:
    seq_id: int
    page_ids: List[int]
    length: int
    last_token: int = 0
    generated: List[int] = field(default_factory=list)


class OffloadServer:
    def __init__(self, cfg: TierConfig, device="cuda"):
        self.cfg = cfg
        self.device = device
        shape = (cfg.num_layers, cfg.num_gpu_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        staging_shape = (len(cfg.staged_layers), 4096, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.staging_kv = torch.zeros(staging_shape, dtype=torch.bfloat16, device=device)
        self.table = TieredPageTable(cfg, device)
        self.store = NvmeStore(cfg.nvme_path, cfg.num_logical_pages, cfg.page_bytes)
        self.attn = TieredAttention(cfg, self.kv_cache, self.staging_kv, self.store, device)
        self.prefetcher = AsyncPrefetcher(cfg, self.table, self.store, self.kv_cache, self.attn, device)
        self.model = TieredModel(cfg, self.attn).to(device)
        self.runner = DecodeGraphRunner(cfg, self.model, self.attn, device)
        self.seqs: Dict[int, Sequence] = {}
        self.pending: Optional[StepBatch] = None
        self.seq_lens_np = np.zeros(cfg.max_batch_size, dtype=np.int64)
        self.out_queue: "queue.Queue" = queue.Queue()
        self._out_thread = threading.Thread(target=self._output_loop, daemon=True)
        self._out_thread.start()

    def add_sequence(self, seq_id: int, page_ids: List[int], length: int, last_token: int) -> None:
        if length > len(page_ids) * self.cfg.page_size:
            raise ValueError(f"sequence {seq_id}: {length} tokens do not fit {len(page_ids)} pages")
        self.seqs[seq_id] = Sequence(seq_id, list(page_ids), length, last_token)
        self.table.mark(np.asarray(page_ids, dtype=np.int64), self.table.tier_np[page_ids[0]], self.table.slot_np[page_ids])

    def warmup(self) -> None:
        self.runner.capture_all(self._dummy_batch)

    def _dummy_batch(self, bs: int) -> StepBatch:
        seqs = [Sequence(-1 - i, [i], 1) for i in range(bs)]
        return self._make_batch(seqs)

    def _bucket(self, bs: int) -> int:
        for b in self.cfg.graph_batch_sizes:
            if b >= bs:
                return b
        return bs

    def _make_batch(self, seqs: List[Sequence]) -> StepBatch:
        ps = self.cfg.page_size
        counts = np.array([len(s.page_ids) for s in seqs], dtype=np.int32)
        page_ids_np = np.concatenate([np.asarray(s.page_ids, dtype=np.int64) for s in seqs])
        indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        last = np.array([(s.length - 1) % ps + 1 for s in seqs], dtype=np.int32)
        page_ids_dev = torch.from_numpy(page_ids_np).to(self.device, non_blocking=True)
        slots_dev = self.table.slot_dev[page_ids_dev]
        staged_n = np.minimum(counts, 4)
        staged_indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum(staged_n, out=staged_indptr[1:])
        return StepBatch(
            num_decode=len(seqs),
            page_ids_np=page_ids_np,
            page_counts_np=counts,
            decode_indptr_np=indptr,
            decode_last_np=last,
            staged_indptr_np=staged_indptr,
            page_ids_dev=page_ids_dev,
            decode_positions_dev=torch.arange(int(indptr[-1]), device=self.device),
            decode_slots_dev=slots_dev,
            staged_slots_dev=torch.arange(int(staged_indptr[-1]), dtype=torch.int32, device=self.device),
            input_ids_dev=torch.tensor([s.last_token for s in seqs], device=self.device),
            positions_dev=torch.tensor([s.length for s in seqs], device=self.device),
        )

    def step(self) -> int:
        seqs = list(self.seqs.values())[: self.cfg.max_batch_size]
        if not seqs:
            return 0
        batch = self._make_batch(seqs)
        self.prefetcher.drain()
        self.prefetcher.prefetch_for_step(batch)
        bs = self._bucket(batch.num_decode)
        self.runner.check_capacity(bs, int(batch.decode_indptr_np[-1]))
        self.attn.stage_decode(batch, bs)
        self.attn.plan_staged(batch, bs)
        self.prefetcher.fence()
        hidden = self.runner.replay(batch, bs)
        next_ids = torch.argmax(hidden @ self.model.embed.weight.T, dim=-1)
        self.out_queue.put(([s.seq_id for s in seqs], next_ids))
        self.pending = batch
        return len(seqs)

    def _output_loop(self) -> None:
        # runs on its own thread; the step never waits for it
        while True:
            seq_ids, next_ids = self.out_queue.get()
            for sid, tok in zip(seq_ids, next_ids.tolist()):  # ok: FC101
                seq = self.seqs.get(sid)
                if seq is None:
                    continue
                seq.generated.append(tok)
                seq.last_token = tok
                seq.length += 1
