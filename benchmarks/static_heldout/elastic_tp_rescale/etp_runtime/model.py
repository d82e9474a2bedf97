"""A tensor-parallel decoder whose attention follows the engine's current TP state."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from elastictp.topology import ModelDims, TPLayout
from etp_runtime.attn_state import TPAttnState


class AttnRouter:
    """Holds the attention state of the degree the engine currently runs at."""

    def __init__(self, state: TPAttnState, group) -> None:
        self.state = state
        self.group = group


class TPAttention(nn.Module):
    def __init__(self, dims: ModelDims, layout: TPLayout, layer_id: int, router: AttnRouter) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.nq, self.nkv, self.hd = layout.q_heads, layout.kv_heads, dims.head_dim
        self.qkv = nn.Linear(dims.hidden, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, dims.hidden, bias=False)
        self.router = router

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        st = self.router.state
        q, k, v = self.qkv(h).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nq, self.hd)
        st.kv.append(self.layer_id, k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd), st.out_loc[: h.shape[0]])
        kv = st.kv.pages[self.layer_id]
        if st.layout.kv_replicated:
            out = st.replica_decode.run(q, kv)  # expect: FC108
        else:
            w = st.active_wrapper()
            out = w.run(q, kv)  # ok: FC108
        out = self.o(out.reshape(-1, self.nq * self.hd))
        dist.all_reduce(out, group=self.router.group)
        return out


class TPLayer(nn.Module):
    def __init__(self, dims: ModelDims, layout: TPLayout, layer_id: int, router: AttnRouter) -> None:
        super().__init__()
        self.attn = TPAttention(dims, layout, layer_id, router)
        self.ln1 = nn.RMSNorm(dims.hidden)
        self.ln2 = nn.RMSNorm(dims.hidden)
        self.up = nn.Linear(dims.hidden, 2 * dims.ffn // layout.tp, bias=False)
        self.down = nn.Linear(dims.ffn // layout.tp, dims.hidden, bias=False)
        self.router = router

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.ln1(h))
        gate, up = self.up(self.ln2(h)).chunk(2, dim=-1)
        mlp = self.down(nn.functional.silu(gate) * up)
        dist.all_reduce(mlp, group=self.router.group)
        return h + mlp


class ElasticLM(nn.Module):
    def __init__(self, dims: ModelDims, layout: TPLayout, router: AttnRouter) -> None:
        super().__init__()
        self.layout = layout
        self.embed = nn.Embedding(dims.vocab // layout.tp, dims.hidden)
        self.layers = nn.ModuleList([TPLayer(dims, layout, i, router) for i in range(dims.num_layers)])
        self.norm = nn.RMSNorm(dims.hidden)
        self.head = nn.Linear(dims.hidden, dims.vocab // layout.tp, bias=False)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids % self.embed.num_embeddings)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))
