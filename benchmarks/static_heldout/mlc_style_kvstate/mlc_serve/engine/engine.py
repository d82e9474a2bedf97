"""The engine loop: schedule, bracket the forward with begin_forward/end_forward, replay a graph when a
bucket fits, verify speculative tokens and roll the rejected ones back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn

from mlc_serve.attn_dispatch import ForwardKind
from mlc_serve.engine.graph_cache import GraphCache
from mlc_serve.engine.sampler import Sampler, SamplingBatch
from mlc_serve.kv_state import KVCacheConfig, PagedKVCache


class TinyLM(nn.Module):
    def __init__(self, cfg: KVCacheConfig, hidden: int, vocab: int):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv = nn.ModuleList(nn.Linear(hidden, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim) for _ in range(cfg.num_layers))
        self.o = nn.ModuleList(nn.Linear(cfg.num_qo_heads * cfg.head_dim, hidden) for _ in range(cfg.num_layers))
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, kv: PagedKVCache) -> torch.Tensor:
        cfg = self.cfg
        h = self.embed(input_ids)
        sizes = [cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        for layer_id in range(cfg.num_layers):
            q, k, v = self.qkv[layer_id](h).split(sizes, dim=-1)
            o = kv.attention(layer_id, q.view(-1, cfg.num_qo_heads, cfg.head_dim), k, v)
            h = h + self.o[layer_id](o.reshape(h.shape[0], -1))
        return self.head(h)


@dataclass
class StepBatch:
    kind: ForwardKind
    seq_ids: List[int]
    append_lengths: List[int]
    input_ids: torch.Tensor
    sampling: SamplingBatch
    spec_len: int = 0
    draft_tokens: Optional[torch.Tensor] = None


class Engine:
    def __init__(self, cfg: KVCacheConfig, hidden: int, vocab: int, device: torch.device, graph_batch_sizes=(1, 2, 4, 8, 16, 32), tree_size: int = 8):
        self.device = device
        self.kv_cache = PagedKVCache(cfg, device)
        self.model = TinyLM(cfg, hidden, vocab).to(device)
        self.sampler = Sampler(vocab)
        self.graphs = GraphCache(self.kv_cache, self.model, graph_batch_sizes, tree_size)
        for bs in graph_batch_sizes:
            self.graphs.record_decode_graph(bs)
            self.graphs.record_verify_graph(bs)
        self.graphs.check_bindings()

    def _verify(self, logits: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        """Greedy chain verification: accepted length = leading run of draft tokens the target agrees with."""
        target = logits.argmax(dim=-1).view(len(batch.seq_ids), -1)[:, :-1]
        match = (target == batch.draft_tokens).int()
        return match.cumprod(dim=1).sum(dim=1)

    def step(self, batch: StepBatch) -> Tuple[torch.Tensor, List[int]]:
        n = len(batch.seq_ids)
        bs = self.graphs.bind_step(batch.kind, batch.seq_ids, batch.append_lengths)
        if bs is not None:
            logits = self.graphs.replay(batch.kind, bs, batch.input_ids)
        else:
            logits = self.model.forward(batch.input_ids, self.kv_cache)
        self.kv_cache.end_forward()
        last = torch.tensor([sum(batch.append_lengths[: i + 1]) - 1 for i in range(n)], device=self.device)
        if batch.kind is ForwardKind.SPEC_VERIFY:
            num_accepted = self._verify(logits, batch)
            for sid, acc in zip(batch.seq_ids, num_accepted):
                self.kv_cache.popn(sid, batch.spec_len - int(acc))  # expect: FC101
            last = last - batch.spec_len + num_accepted
        tokens = self.sampler.sample(logits[last], batch.sampling)
        return tokens, batch.seq_ids
