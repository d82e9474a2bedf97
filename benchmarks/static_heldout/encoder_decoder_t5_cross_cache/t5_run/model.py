"""T5 encoder (SDPA with the bidirectional bias) and decoder (FlashInfer self and cross attention)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from t5_attn.backend import EncDecBackend
from t5serve import FP16_CLAMP_MARGIN, RelativeBiasTable, T5Config


def clamp_fp16(h: torch.Tensor) -> torch.Tensor:
    if h.dtype != torch.float16:
        return h
    cv = torch.finfo(h.dtype).max - FP16_CLAMP_MARGIN
    return torch.where(torch.isinf(h), torch.sign(h) * cv, h)  # ok: FC101


class T5FFN(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.d_model)
        self.wi = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.wi(self.norm(h)).chunk(2, dim=-1)
        return h + self.wo(F.gelu(gate, approximate="tanh") * up)


class T5EncoderLayer(nn.Module):
    def __init__(self, cfg: T5Config):
        super().__init__()
        self.cfg = cfg
        self.norm = nn.RMSNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.inner, bias=False)
        self.o = nn.Linear(cfg.inner, cfg.d_model, bias=False)
        self.ffn = T5FFN(cfg)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.norm(h)).view(b, t, 3, self.cfg.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), scale=1.0)
        h = h + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return clamp_fp16(self.ffn(h))


@dataclass
class DecodeStatics:
    input_ids: torch.Tensor
    out_loc: torch.Tensor
    recent_slots: torch.Tensor
    bias_rows: torch.Tensor


class T5DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: T5Config, backend: EncDecBackend):
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        self.backend = backend
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.self_qkv = nn.Linear(cfg.d_model, 3 * cfg.inner, bias=False)
        self.self_o = nn.Linear(cfg.inner, cfg.d_model, bias=False)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.cross_q = nn.Linear(cfg.d_model, cfg.inner, bias=False)
        self.cross_kv = nn.Linear(cfg.d_model, 2 * cfg.inner, bias=False)
        self.cross_o = nn.Linear(cfg.inner, cfg.d_model, bias=False)
        self.ffn = T5FFN(cfg)

    def forward(self, h: torch.Tensor, st: DecodeStatics, bs: int) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.self_qkv(self.norm1(h)).view(bs, 3, cfg.num_heads, cfg.head_dim).unbind(1)
        self.backend.write_self_kv(self.layer_id, k, v, st.out_loc[:bs])
        o = self.backend.self_attend(self.layer_id, q, bs, st.bias_rows, st.recent_slots)
        h = clamp_fp16(h + self.self_o(o.reshape(bs, -1)))
        q = self.cross_q(self.norm2(h)).view(bs, cfg.num_heads, cfg.head_dim)
        h = h + self.cross_o(self.backend.cross_attend(self.layer_id, q, bs).reshape(bs, -1))
        h = self.ffn(h)
        if torch.isinf(h).any():  # expect: FC101
            h = h.clamp(-torch.finfo(h.dtype).max + FP16_CLAMP_MARGIN, torch.finfo(h.dtype).max - FP16_CLAMP_MARGIN)
        return h


class T5Model(nn.Module):
    def __init__(self, cfg: T5Config, backend: EncDecBackend):
        super().__init__()
        self.cfg = cfg
        self.shared = nn.Embedding(cfg.vocab, cfg.d_model)
        self.enc_bias = RelativeBiasTable(cfg.num_heads, bidirectional=True)
        self.dec_bias = RelativeBiasTable(cfg.num_heads, bidirectional=False)
        self.encoder = nn.ModuleList([T5EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)])
        self.enc_norm = nn.RMSNorm(cfg.d_model)
        self.decoder = nn.ModuleList([T5DecoderLayer(i, cfg, backend) for i in range(cfg.num_decoder_layers)])
        self.dec_norm = nn.RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def encode(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        bias = self.enc_bias.encoder_bias(lengths)
        h = self.shared(input_ids)
        for layer in self.encoder:
            h = layer(h, bias)
        return self.enc_norm(h)

    def cross_kv_for(self, layer: int, enc_out: torch.Tensor):
        k, v = self.decoder[layer].cross_kv(enc_out).view(enc_out.shape[0], 2, self.cfg.num_heads, -1).unbind(1)
        return k, v

    def decode(self, st: DecodeStatics, bs: int) -> torch.Tensor:
        h = self.shared(st.input_ids[:bs])
        for layer in self.decoder:
            h = layer(h, st, bs)
        return self.lm_head(self.dec_norm(h) * self.cfg.d_model ** -0.5)
