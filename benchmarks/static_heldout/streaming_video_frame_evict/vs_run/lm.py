"""The language model over frame tokens and text, and its decode graphs per bucket."""
from typing import Dict, List

import torch
from torch import nn

from vs_attn.backend import VideoLMBackend
from vstream import VideoStreamConfig


class LMAttn(nn.Module):
    def __init__(self, cfg: VideoStreamConfig, backend: VideoLMBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def decode(self, h: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        return h + self.o_proj(self.backend.forward_decode(self._q(h), kv, bs).flatten(1))

    def ingest(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return h + self.o_proj(self.backend.forward_ingest(self._q(h), kv).flatten(1))


class VideoLM(nn.Module):
    def __init__(self, cfg: VideoStreamConfig, backend: VideoLMBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LMAttn(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, ids: torch.Tensor, kv_caches: List[torch.Tensor], bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(h, kv, bs)
        return self.lm_head(h)

    def ingest(self, h: torch.Tensor, kv_caches: List[torch.Tensor]) -> None:
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.ingest(h, kv)


class LMGraphRunner:
    def __init__(self, lm: VideoLM, backend: VideoLMBackend, cfg: VideoStreamConfig, device: torch.device):
        self.lm, self.backend = lm, backend
        max_bs = max(cfg.decode_buckets)
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.capture_pos: Dict[int, int] = {}
        self._fixed_batch_size: Dict[int, int] = {}  # ok: FC103

    def record(self, bs: int, kv_caches: List[torch.Tensor]) -> None:
        self.backend.plan_capture(bs)
        self.capture_pos[bs] = self.static_positions[:bs].max().item()  # expect: FC101
        self.lm.decode(self.static_ids[:bs], kv_caches, bs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits[bs] = self.lm.decode(self.static_ids[:bs], kv_caches, bs)
        self.graphs[bs] = graph
        self._fixed_batch_size[bs] = bs

    def replay(self, bs: int, n: int, ids: torch.Tensor) -> torch.Tensor:
        if self._fixed_batch_size.get(bs) != bs:
            raise KeyError(f"no decode graph for bucket {bs}")
        self.static_ids[:n].copy_(ids)
        self.graphs[bs].replay()
        return self.logits[bs][:n]
