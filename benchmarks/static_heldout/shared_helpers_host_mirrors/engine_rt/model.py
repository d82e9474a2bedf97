"""A small decoder whose forward calls the shared helpers on device tensors."""

import torch
from torch import nn

from engine_rt.attention import HelperAttnBackend
from engine_rt.batch import ForwardBatch
from shmirror.config import EngineConfig
from shmirror.helpers.clamp import clamp_lens
from shmirror.helpers.indptr import cumsum_indptr


class KVStore:
    """One ``[num_pages, 2, page_size, kv_heads, head_dim]`` cache per layer (NHD)."""

    def __init__(self, cfg: EngineConfig, device, dtype=torch.float16):
        self.caches = [
            torch.zeros(
                cfg.max_total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device
            )
            for _ in range(cfg.num_layers)
        ]

    def write(self, layer_id: int, k, v, pages, offsets):
        cache = self.caches[layer_id]
        cache[pages, 0, offsets] = k
        cache[pages, 1, offsets] = v


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, base: float = 10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, x, positions):
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Layer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: HelperAttnBackend, kv: KVStore):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.kv = kv
        self.nq = cfg.num_qo_heads
        self.nkv = cfg.num_kv_heads
        self.hd = cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.SiLU(), nn.Linear(4 * cfg.hidden, cfg.hidden))
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.norm2 = nn.RMSNorm(cfg.hidden)
        self.rope = Rotary(cfg.head_dim, cfg.max_seq_len)

    def _project(self, h, fb: ForwardBatch, positions):
        q, k, v = self.qkv(self.norm1(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = self.rope(q.view(-1, self.nq, self.hd), positions)
        k = self.rope(k.view(-1, self.nkv, self.hd), positions)
        self.kv.write(self.layer_id, k, v.view(-1, self.nkv, self.hd), fb.write_pages, fb.write_offsets)
        return q

    def _finish(self, h, o):
        h = h + self.o(o.reshape(-1, self.nq * self.hd))
        return h + self.mlp(self.norm2(h))

    def decode(self, h, fb: ForwardBatch, positions):
        q = self._project(h, fb, positions)
        o = self.backend.forward_decode(q, self.kv.caches[self.layer_id], self.layer_id)
        return self._finish(h, o)

    def extend(self, h, fb: ForwardBatch, positions):
        q = self._project(h, fb, positions)
        o = self.backend.forward_extend(q, self.kv.caches[self.layer_id])
        return self._finish(h, o)


class TinyLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: HelperAttnBackend, device):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.kv = KVStore(cfg, device)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([Layer(cfg, i, backend, self.kv) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def decode(self, fb: ForwardBatch):
        self.backend.begin_decode_forward()
        positions = clamp_lens(fb.positions, self.cfg.max_seq_len - 1)
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb, positions)
        return self.lm_head(self.norm(h))

    def extend(self, fb: ForwardBatch):
        positions = clamp_lens(fb.positions, self.cfg.max_seq_len - 1)
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb, positions)
        # logits of the last token of every prompt, located with the device indptr
        qo_indptr = cumsum_indptr(fb.extend_lens)
        last = (qo_indptr[1:] - 1).long()
        return self.lm_head(self.norm(h[last]))
