"""Graphs only for decode-only steps, one per bucket, padded with empty rows."""

import bisect
from typing import Dict

import torch

from chunkserve.config import ChunkConfig
from chunk_attn.backend import InterleavedAttnBackend
from chunk_attn.metadata import DecodeOnlyMetadata, dummy_decode_only
from chunk_attn.model import ChunkLM


class DecodeOnlyGraphs:
    def __init__(self, model: ChunkLM, backend: InterleavedAttnBackend, cfg: ChunkConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.decode_buckets)
        self.max_bs = self.buckets[-1]
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.mempool = None
        backend.init_graph_state()

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            md = dummy_decode_only(bs, self.device)
            self.backend.prepare_decode_capture(bs, md)
            w = self.backend.graph_decode[bs]
            if getattr(w, "_fixed_batch_size", bs) != bs:  # expect: FC103
                raise RuntimeError(f"bucket {bs} is bound to a wrapper planned for another batch size")
            ids, pos = self.static_ids[:bs], self.static_pos[:bs]
            for _ in range(2):
                self.model.forward_decode(ids, pos)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                self.static_logits[bs] = self.model.forward_decode(ids, pos)
            if self.mempool is None:
                self.mempool = graph.pool()
            self.graphs[bs] = graph

    def run(self, md: DecodeOnlyMetadata, input_ids: torch.Tensor) -> torch.Tensor:
        n = md.num_decode
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        md.graph_bs = bs
        self.backend.prepare_decode_replay(bs, md)
        self.static_ids[:n].copy_(input_ids, non_blocking=True)
        self.static_pos[:n].copy_(md.positions, non_blocking=True)
        self.graphs[bs].replay()
        return self.static_logits[bs][:n]

    def replay_debug_dump(self, bs: int) -> dict:
        bufs = self.backend.graph_bufs
        return {
            "kv_indptr": bufs["kv_indptr"][: bs + 1].tolist(),  # ok: FC101
            "last_page_len": bufs["last_page_len"][:bs].tolist(),
        }
