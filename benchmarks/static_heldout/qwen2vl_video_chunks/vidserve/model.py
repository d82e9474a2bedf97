import torch
from torch import nn

from vidserve.attn.backend import VideoAttnBackend
from vidserve.config import VideoEngineConfig


class VideoLM(nn.Module):
    def __init__(self, cfg: VideoEngineConfig, backend: VideoAttnBackend, kv_cache, mem_k, mem_v):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.kv_cache, self.mem_k, self.mem_v = kv_cache, mem_k, mem_v
        hidden = cfg.num_heads * cfg.head_dim
        self.embed = nn.Embedding(152064, hidden)
        self.rope = nn.Linear(3, hidden, bias=False)
        self.lm_head = nn.Linear(hidden, 152064, bias=False)

    def decode(self, bs, input_ids, positions):
        h = self.embed(input_ids) + self.rope(positions.t().float())
        q = h.view(bs, self.cfg.num_heads, self.cfg.head_dim)
        o = self.backend.decode(bs, q, self.kv_cache, self.mem_k, self.mem_v)
        return self.lm_head(o.reshape(bs, -1))
