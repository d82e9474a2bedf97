"""The model captures a decode graph the first time it sees a bucket, inside `decode` itself."""
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from ice import DecodeBatch, EngineConfig
from ice_attn.registry import AttentionBackend
from ice_model.layers import DecoderLayer, RMSNorm, RotaryEmbedding


@dataclass
class CapturedStep:
    input_ids: torch.Tensor
    positions: torch.Tensor
    logits: Optional[torch.Tensor] = None
    graph: Optional[torch.cuda.CUDAGraph] = None

    @classmethod
    def allocate(cls, bucket: int, device: torch.device) -> "CapturedStep":
        return cls(
            input_ids=torch.zeros(bucket, dtype=torch.int64, device=device),
            positions=torch.zeros(bucket, dtype=torch.int64, device=device),
        )

    def load(self, batch: DecodeBatch) -> None:
        bs = batch.batch_size
        self.input_ids[:bs].copy_(batch.input_ids)
        self.positions[:bs].copy_(batch.positions)


class Transformer(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend, device: torch.device, kv_caches: List[torch.Tensor]):
        super().__init__()
        assert len(kv_caches) == cfg.num_layers, "one paged KV cache per layer"  # expect: FC109
        self.cfg = cfg
        self.backend = backend
        self.kv_caches = kv_caches
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.rotary = RotaryEmbedding(cfg, device)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend, self.rotary, device) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, device, cfg.dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=cfg.dtype)
        self._graphs: Dict[int, CapturedStep] = {}
        self._pool = None

    def _forward_step(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, positions, kv, bs)
        return self.lm_head(self.norm(h))

    def decode(self, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.batch_size
        bucket = self.backend.bucket_for(bs)
        if bucket is None:
            self.backend.init_forward_metadata(batch)
            return self._forward_step(batch.input_ids, batch.positions, bs)

        entry = self._graphs.get(bucket)
        if entry is None:
            # first sight of this bucket: warm up eagerly on the static inputs, then capture
            entry = CapturedStep.allocate(bucket, batch.input_ids.device)
            entry.load(batch)
            self.backend.init_forward_metadata(batch)
            for _ in range(2):
                self._forward_step(entry.input_ids, entry.positions, bucket)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                entry.logits = self._forward_step(entry.input_ids, entry.positions, bucket)
            self._pool = graph.pool()
            entry.graph = graph
            self._graphs[bucket] = entry
            self._check_pool()
        return self._replay_graph(entry, batch)[:bs]

    def _replay_graph(self, entry: CapturedStep, batch: DecodeBatch) -> torch.Tensor:
        bs = batch.batch_size
        if batch.max_seq_len > self.cfg.max_context_len:
            raise ValueError("a sequence outgrew max_context_len")
        if (batch.positions < 0).any():  # expect: FC101
            raise ValueError("negative position in a decode batch")
        self.backend.init_forward_metadata(batch)
        entry.input_ids[:bs].copy_(batch.input_ids)  # ok: FC104
        entry.positions = torch.cat([batch.positions, entry.positions[bs:]])  # expect: FC107
        entry.graph.replay()
        return entry.logits

    def _check_pool(self) -> None:
        assert self._pool is not None, "graph pool lost after capture"  # ok: FC109
