import torch

from fimserve.kernels.attention import FimAttention
from fimserve.limits import ServeLimits
from fimserve.model import CodeModel


class CompletionGraphs:
    def __init__(self, limits: ServeLimits, model: CodeModel, attn: FimAttention, kv_caches, repo_kvs, device):
        self.limits = limits
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.repo_kvs = repo_kvs
        self.static_input_ids = torch.zeros(limits.max_batch, dtype=torch.long, device=device)
        self.static_positions = torch.zeros(limits.max_batch, dtype=torch.long, device=device)
        self.static_seq_lens = torch.ones(limits.max_batch, dtype=torch.int32, device=device)
        self.max_len = limits.max_tokens
        self.graphs = {}
        self.logits = {}

    def capture(self, bs: int, template_batch):
        self.attn.plan_for_capture(bs)
        mean_len = float(self.static_seq_lens[:bs].float().mean())  # expect: FC101
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.logits[bs] = self.model(self.static_input_ids[:bs], self.kv_caches, self.repo_kvs, bs)
        self.graphs[bs] = g
        return mean_len

    def replay(self, bs: int, batch):
        self.static_seq_lens.resize_(bs)  # expect: FC107
        self.static_seq_lens[:bs].copy_(batch.seq_lens)
        if self.static_seq_lens[:bs].max() > self.max_len:  # expect: FC101
            raise RuntimeError("completion ran past the context window")
        self.static_input_ids[:bs].copy_(batch.input_ids)
        self.attn.plan_decode(bs, batch)
        self.graphs[bs].replay()
        return self.logits[bs]
