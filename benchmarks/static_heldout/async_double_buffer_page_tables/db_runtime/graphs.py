"""Decode graphs per bucket, captured once against each of the two buffer sets."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch

from db_attn.backend import DecodeContext, DoubleBufferAttnBackend
from db_runtime.model import TinyLM
from dbuf.config import DoubleBufferConfig

_GRAPH_FLAG = "_use_cuda_graph"


@dataclasses.dataclass
class SlotGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class SlotGraphRunner:
    def __init__(self, cfg: DoubleBufferConfig, model: TinyLM, backend: DoubleBufferAttnBackend,
                 kv_cache: torch.Tensor, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.device = device
        self.static_ids = [torch.zeros(cfg.max_batch, dtype=torch.long, device=device) for _ in range(2)]
        self.static_positions = [torch.zeros(cfg.max_batch, dtype=torch.long, device=device) for _ in range(2)]
        self.pad_positions = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.graphs: List[Dict[int, SlotGraph]] = [{}, {}]
        self.mempool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in self.cfg.buckets:
            if b >= bs:
                return b
        return None

    def check_graph_mode(self) -> None:
        for slot in range(2):
            for bs, w in self.backend.graph_wrappers[slot].items():
                if not getattr(w, _GRAPH_FLAG, False):  # expect: FC103
                    raise RuntimeError(f"bucket {bs} of slot {slot} is not a graph-mode wrapper")

    def capture_all(self) -> None:
        assert not self.graphs[0] and not self.graphs[1], "capture_all runs once"  # ok: FC109
        self.backend.init_graph_wrappers()
        self.check_graph_mode()
        torch.cuda.synchronize(self.device)  # ok: FC101
        for slot in (0, 1):
            for bs in sorted(self.cfg.buckets, reverse=True):
                self._capture_one(slot, bs)

    def _capture_one(self, slot: int, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(slot, bs)
        ctx = DecodeContext(slot=slot, bs=bs, graph=True, long_rows=self.cfg.capture_long_rows)
        ids = self.static_ids[slot][:bs]
        pos = self.static_positions[slot][:bs]
        for _ in range(2):
            self.model.decode(ids, pos, self.kv_cache, ctx)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            logits = self.model.decode(ids, pos, self.kv_cache, ctx)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[slot][bs] = SlotGraph(graph=g, logits=logits)

    def replay(self, slot: int, bs: int, real_bs: int, ids: torch.Tensor, positions: torch.Tensor,
               seq_lens: torch.Tensor) -> torch.Tensor:
        bufs = self.backend.buffer_sets[slot]
        # the stager's H2D copies for this set were queued on the copy stream
        torch.cuda.current_stream(self.device).wait_event(bufs.ready)  # ok: FC101
        if (seq_lens[:real_bs] > self.cfg.max_context).any():  # expect: FC101
            raise ValueError("a row passed max_context inside a captured bucket")
        self.static_ids[slot][:real_bs].copy_(ids)
        self.static_positions[slot] = torch.cat([positions, self.pad_positions[: bs - real_bs]])  # expect: FC107
        self.backend.prepare_replay(slot, bs, real_bs)
        entry = self.graphs[slot][bs]
        entry.graph.replay()
        bufs.consumed.record()
        return entry.logits[:real_bs]

    def describe(self) -> dict:
        # for the /debug endpoint only
        return {
            "captured": [sorted(g) for g in self.graphs],
            "slot0_ids": self.static_ids[0][:4].tolist(),  # ok: FC101
        }
