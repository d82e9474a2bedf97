from torch import nn


class PermutedLayer(nn.Module):
    def __init__(self, limits, layer_id, backend):
        super().__init__()
        lim = limits
        self.layer_id = layer_id
        self.num_heads = lim.num_qo_heads
        self.num_kv_heads = lim.num_kv_heads
        self.head_dim = lim.head_dim
        self.qkv = nn.Linear(lim.hidden, (lim.num_qo_heads + 2 * lim.num_kv_heads) * lim.head_dim, bias=False)
        self.o_proj = nn.Linear(lim.num_qo_heads * lim.head_dim, lim.hidden, bias=False)
        self.backend = backend

    def _qkv(self, h):
        qs, ks = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(h).split([qs, ks, ks], dim=-1)
        return (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

    def forward(self, h, meta):
        q, k, v = self._qkv(h)
        if meta is None:
            o = self.backend.prefill_attend(q, k, v)
        else:
            o = self.backend.attend(q, self.layer_id, meta)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def decode_graph(self, h, meta):
        q, _, _ = self._qkv(h)
        o = self.backend.attend(q, self.layer_id, meta)
        return self.o_proj(o.reshape(h.shape[0], -1))


class PermutedModel(nn.Module):
    def __init__(self, limits, backend):
        super().__init__()
        self._sm_scale = limits.head_dim**-0.5  # ok: FC103
        self.embed = nn.Embedding(limits.vocab, limits.hidden)
        self.layers = nn.ModuleList([PermutedLayer(limits, i, backend) for i in range(limits.num_layers)])
        self.norm = nn.RMSNorm(limits.hidden)
        self.lm_head = nn.Linear(limits.hidden, limits.vocab, bias=False)

    def forward(self, input_ids, positions, meta=None):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer(h, meta)
        return self.lm_head(self.norm(h))

    def decode_graph(self, input_ids, positions, meta):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.decode_graph(h, meta)
        return self.lm_head(self.norm(h))
