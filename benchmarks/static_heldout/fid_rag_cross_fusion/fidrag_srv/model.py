"""Encoder-decoder stand-in: the encoder runs per passage, the decoder fuses all passages."""

import torch
from torch import nn

from fidrag.config import FiDConfig
from fidrag_srv.cross_attn import CrossAttnBackend
from fidrag_srv.encoder_attn import RaggedEncoderBackend


class FiDModel(nn.Module):
    def __init__(self, cfg: FiDConfig, encoder: RaggedEncoderBackend, cross: CrossAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.encoder = encoder
        self.cross = cross
        d = cfg.hidden_size
        qd = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.enc_qkv = nn.ModuleList([nn.Linear(d, 3 * qd, bias=False) for _ in range(cfg.num_enc_layers)])
        self.enc_out = nn.ModuleList([nn.Linear(qd, d, bias=False) for _ in range(cfg.num_enc_layers)])
        self.dec_q = nn.ModuleList([nn.Linear(d, qd, bias=False) for _ in range(cfg.num_dec_layers)])
        self.dec_out = nn.ModuleList([nn.Linear(2 * qd, d, bias=False) for _ in range(cfg.num_dec_layers)])
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        # KV pools: [layers, pages, 2, page_size, heads, head_dim]
        self.self_kv = torch.empty(0)
        self.cross_kv = torch.empty(0)

    def bind_pools(self, self_kv: torch.Tensor, cross_kv: torch.Tensor) -> None:
        self.self_kv = self_kv
        self.cross_kv = cross_kv

    def encode(self, token_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(token_ids)
        n = token_ids.shape[0]
        hq = self.cfg.num_qo_heads
        for layer in range(self.cfg.num_enc_layers):
            q, k, v = self.enc_qkv[layer](h).view(n, 3, hq, self.cfg.head_dim).unbind(1)
            h = h + self.enc_out[layer](self.encoder.forward(q, k, v).reshape(n, -1))
        return h

    def _gate(self, passage_bias: torch.Tensor, bs: int) -> torch.Tensor:
        per_req = self.cfg.passages_per_query
        scores = passage_bias[: bs * per_req].view(bs, per_req)
        return torch.softmax(scores, dim=-1).max(dim=-1).values.unsqueeze(-1)

    def decode_graphed(self, input_ids: torch.Tensor, passage_bias: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        gate = self._gate(passage_bias, bs)
        for layer in range(self.cfg.num_dec_layers):
            q = self.dec_q[layer](h).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
            o_self, o_cross = self.cross.forward_decode_graph(q, self.self_kv[layer], self.cross_kv[layer], bs)
            fused = torch.cat([o_self.reshape(bs, -1), gate * o_cross.reshape(bs, -1)], dim=-1)
            h = h + self.dec_out[layer](fused)
        return self.lm_head(h)

    def decode_eager(self, input_ids: torch.Tensor, passage_bias: torch.Tensor) -> torch.Tensor:
        bs = input_ids.shape[0]
        h = self.embed(input_ids)
        gate = self._gate(passage_bias, bs)
        for layer in range(self.cfg.num_dec_layers):
            q = self.dec_q[layer](h).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
            o_self, o_cross = self.cross.forward_decode_eager(q, self.self_kv[layer], self.cross_kv[layer])
            fused = torch.cat([o_self.reshape(bs, -1), gate * o_cross.reshape(bs, -1)], dim=-1)
            h = h + self.dec_out[layer](fused)
        return self.lm_head(h)
