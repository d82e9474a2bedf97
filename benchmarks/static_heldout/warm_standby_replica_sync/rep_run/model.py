"""A Llama-shaped decoder; decode positions come from the backend's sequence lengths."""

import flashinfer
import torch
from torch import nn

from rep_attn.backend import ReplicaBackend
from standby.config import ReplicaConfig


class ReplicaLayer(nn.Module):
    def __init__(self, cfg: ReplicaConfig, layer_id: int, backend: ReplicaBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.page_size = cfg.page_size
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.in_norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _project(self, h, positions, kv_cache, slots):
        n = h.shape[0]
        q, k, v = self.qkv(self.in_norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q, k = flashinfer.apply_rope_pos_ids(q.view(n, self.nq, self.hd), k.view(n, self.nkv, self.hd), positions)
        page = torch.div(slots, self.page_size, rounding_mode="floor")
        off = slots - page * self.page_size
        kv_cache[self.layer_id][page, 0, :, off] = k
        kv_cache[self.layer_id][page, 1, :, off] = v.view(n, self.nkv, self.hd)
        return q

    def _finish(self, h, o):
        h = h + self.o(o.reshape(h.shape[0], -1))
        g, u = self.gate_up(self.post_norm(h)).chunk(2, -1)
        return h + self.down(nn.functional.silu(g) * u)

    def forward_decode(self, h, positions, kv_cache, slots):
        q = self._project(h, positions, kv_cache, slots)
        return self._finish(h, self.backend.forward_decode(q, kv_cache, self.layer_id))

    def forward_prefill(self, h, positions, kv_cache, slots):
        q = self._project(h, positions, kv_cache, slots)
        return self._finish(h, self.backend.forward_prefill(q, kv_cache, self.layer_id))


class ReplicaModel(nn.Module):
    def __init__(self, cfg: ReplicaConfig, backend: ReplicaBackend):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([ReplicaLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, kv_cache, slots) -> torch.Tensor:
        positions = self.backend.seq_lens_buf[: input_ids.shape[0]] - 1
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, kv_cache, slots)
        return self.head(self.norm(h))

    def forward_prefill(self, input_ids, positions, kv_cache, slots, last_rows) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, kv_cache, slots)
        return self.head(self.norm(h.index_select(0, last_rows)))
