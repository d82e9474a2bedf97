from torch import nn

from radix_srv.forward_batch import ForwardMode


class RadixAttention(nn.Module):
    def __init__(self, args, layer_id, backend):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = args.num_qo_heads
        self.head_dim = args.head_dim
        self.q_proj = nn.Linear(args.hidden, args.num_qo_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.num_qo_heads * args.head_dim, args.hidden, bias=False)
        self.backend = backend

    def forward(self, h, fb):
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        if fb.forward_mode == ForwardMode.DECODE:
            o = self.backend.forward_decode(q, self.layer_id, fb.block_tables, fb.seq_lens)
        else:
            o = self.backend.forward_extend(q, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def decode(self, h, fb):
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        o = self.backend.forward_decode(q, self.layer_id, fb.block_tables, fb.seq_lens)
        return self.o_proj(o.reshape(h.shape[0], -1))


class RadixLM(nn.Module):
    def __init__(self, args, backend):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.hidden)
        self.layers = nn.ModuleList([RadixAttention(args, i, backend) for i in range(args.num_layers)])
        self.norm = nn.RMSNorm(args.hidden)
        self.lm_head = nn.Linear(args.hidden, args.vocab, bias=False)

    def forward(self, input_ids, positions, fb):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer(h, fb)
        return self.lm_head(self.norm(h))

    def decode(self, input_ids, positions, fb):
        """The captured decode step: decode attention only."""
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.decode(h, fb)
        return self.lm_head(self.norm(h))
