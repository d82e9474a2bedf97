"""T5 v1.1 encoder-decoder; every attention goes through T5AttnBackend."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from t5srv.attention import T5AttnBackend
from t5srv.config import T5Config


class T5LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


class T5GatedFF(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.norm(h)
        return h + self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class T5Projections(nn.Module):
    def __init__(self, cfg: T5Config, names: str):
        super().__init__()
        self.h, self.d = cfg.num_heads, cfg.d_kv
        for name in names:
            setattr(self, name, nn.Linear(cfg.d_model, cfg.num_heads * cfg.d_kv, bias=False))
        self.o = nn.Linear(cfg.num_heads * cfg.d_kv, cfg.d_model, bias=False)

    def heads(self, proj: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return proj(x).view(-1, self.h, self.d)


class T5EncoderLayer(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.attn = T5Projections(cfg, "qkv")
        self.ff = T5GatedFF(cfg)

    def forward(self, h: torch.Tensor, backend: T5AttnBackend) -> torch.Tensor:
        x = self.norm(h)
        a = self.attn
        o = backend.forward_encoder(a.heads(a.q, x), a.heads(a.k, x), a.heads(a.v, x))
        return self.ff(h + a.o(o.flatten(1)))


class T5DecoderLayer(nn.Module):
    def __init__(self, cfg: T5Config, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.self_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.self_attn = T5Projections(cfg, "qkv")
        self.cross_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.cross_attn = T5Projections(cfg, "qkv")
        self.ff = T5GatedFF(cfg)

    def cross_kv(self, enc_out: torch.Tensor):
        c = self.cross_attn
        return c.heads(c.k, enc_out), c.heads(c.v, enc_out)

    def decode(self, h: torch.Tensor, out_cache_loc: torch.Tensor, backend: T5AttnBackend) -> torch.Tensor:
        s = self.self_attn
        x = self.self_norm(h)
        backend.save_self_kv(self.layer_id, s.heads(s.k, x), s.heads(s.v, x), out_cache_loc)
        h = h + s.o(backend.forward_self(s.heads(s.q, x), self.layer_id).flatten(1))
        c = self.cross_attn
        o = backend.forward_cross(c.heads(c.q, self.cross_norm(h)), self.layer_id)
        return self.ff(h + c.o(o.flatten(1)))


class T5ForConditionalGeneration(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder_rel_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)
        self.decoder_rel_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)
        self.encoder = nn.ModuleList([T5EncoderLayer(cfg) for _ in range(cfg.num_layers)])
        self.decoder = nn.ModuleList([T5DecoderLayer(cfg, i) for i in range(cfg.num_decoder_layers)])
        self.encoder_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.decoder_norm = T5LayerNorm(cfg.d_model, cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def encode(self, input_ids: torch.Tensor, backend: T5AttnBackend) -> torch.Tensor:
        """input_ids: [bs, padded_len]; padded keys are masked by the encoder plan."""
        h = self.shared(input_ids.flatten())
        for layer in self.encoder:
            h = layer(h, backend)
        return self.encoder_norm(h)

    def fill_cross_kv(self, enc_out: torch.Tensor, cross_loc: torch.Tensor, backend: T5AttnBackend) -> None:
        for layer in self.decoder:
            k, v = layer.cross_kv(enc_out)
            backend.save_cross_kv(layer.layer_id, k, v, cross_loc)

    def decode_step(self, input_ids: torch.Tensor, out_cache_loc: torch.Tensor, backend: T5AttnBackend) -> torch.Tensor:
        h = self.shared(input_ids)
        for layer in self.decoder:
            h = layer.decode(h, out_cache_loc, backend)
        return self.lm_head(self.decoder_norm(h))
