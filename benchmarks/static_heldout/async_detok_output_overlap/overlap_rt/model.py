from torch import nn


class OverlapAttentionLayer(nn.Module):
    def __init__(self, settings, layer_id, backend):
        super().__init__()
        s = settings
        self.layer_id = layer_id
        self.num_heads = s.num_qo_heads
        self.num_kv_heads = s.num_kv_heads
        self.head_dim = s.head_dim
        self.qkv = nn.Linear(s.hidden, (s.num_qo_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_qo_heads * s.head_dim, s.hidden, bias=False)
        self.backend = backend

    def _split(self, h):
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv(h).split([q_size, kv_size, kv_size], dim=-1)
        return (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

    def forward(self, h, meta):
        q, k, v = self._split(h)
        if meta.is_decode:
            o = self.backend.forward_decode(q, self.layer_id, meta)
        else:
            o = self.backend.forward_extend(q, k, v, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def decode_graph(self, h, meta):
        q, _, _ = self._split(h)
        o = self.backend.forward_decode(q, self.layer_id, meta)
        return self.o_proj(o.reshape(h.shape[0], -1))


class OverlapModel(nn.Module):
    def __init__(self, settings, backend):
        super().__init__()
        self.embed = nn.Embedding(settings.vocab, settings.hidden)
        self.layers = nn.ModuleList([OverlapAttentionLayer(settings, i, backend) for i in range(settings.num_layers)])
        self.norm = nn.RMSNorm(settings.hidden)
        self.lm_head = nn.Linear(settings.hidden, settings.vocab, bias=False)

    def forward(self, input_ids, positions, meta):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer(h, meta)
        return self.lm_head(self.norm(h))

    def decode_graph(self, input_ids, positions, meta):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.decode_graph(h, meta)
        return self.lm_head(self.norm(h))
