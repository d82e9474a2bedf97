"""Decoder whose KV lands in both pools (the row's own page, or the trash page of the other pool)."""

from torch import nn

from kvlayout.config import ServerConfig
from kvlayout.layouts import KVLayout
from layout_attn.backend import LayoutAttnBackend
from layout_attn.batch import LayoutBatch


class Block(nn.Module):
    def __init__(self, cfg: ServerConfig, layer_id: int, backend: LayoutAttnBackend, pools: dict):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.pools = pools
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.SiLU(), nn.Linear(4 * cfg.hidden, cfg.hidden))

    def forward(self, h, batch: LayoutBatch):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nq, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        self.pools[KVLayout.NHD].write_tokens(self.layer_id, k, v, batch.nhd_write_pages, batch.write_offsets)
        self.pools[KVLayout.HND].write_tokens(self.layer_id, k, v, batch.hnd_write_pages, batch.write_offsets)
        if self.backend.forward_metadata.use_trtllm:
            o = self.backend.forward_decode_long(q, self.layer_id)
        else:
            o = self.backend.forward_decode(q, self.layer_id)
        h = h + self.o(o.reshape(-1, self.nq * self.hd))
        return h + self.mlp(h)


class LayoutLM(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: LayoutAttnBackend, pools: dict):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList([Block(cfg, i, backend, pools) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def decode(self, batch: LayoutBatch):
        h = self.embed(batch.input_ids)
        for block in self.blocks:
            h = block(h, batch)
        return self.lm_head(self.norm(h))
