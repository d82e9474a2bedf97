"""Distributed top-k / top-p over vocabulary shards."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from vpsample.dist import TPGroup
from vpsample.envs import global_config
from vpsample.layout import VocabShard
from vpsample.sampling.params import SamplingTensors


class VocabParallelSampler:
    def __init__(self, shard: VocabShard, group: TPGroup, max_rows: int, graph_rows: int, device: torch.device):
        self.shard = shard
        self.group = group
        self.world = group.world_size
        self.device = device
        self.max_rows = max_rows
        self.max_k = global_config.sampler_max_k
        # values and global ids packed in one float32 buffer (ids < 2**24 are exact), so that one
        # all-gather carries both; sized for the graph buckets and read by the recorded graphs
        self.gather_buf = torch.empty(self.world * graph_rows * self.max_k * 2, dtype=torch.float32, device=device)
        self.presence = torch.zeros(max_rows, shard.vocab_size, dtype=torch.int8, device=device)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(1234)
        self._noise: Optional[torch.Tensor] = None

    def _exchange(self, vals: torch.Tensor, ids: torch.Tensor, bs: int, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        assert self.gather_buf.dtype == torch.float32  # ok: FC109
        send = torch.stack([vals, ids.float()])
        recv = self.gather_buf[: self.world * send.numel()]
        self.group.all_gather_into(recv, send.flatten())
        both = recv.view(self.world, 2, bs, k)
        cand_vals = both[:, 0].permute(1, 0, 2).reshape(bs, self.world * k)
        cand_ids = both[:, 1].permute(1, 0, 2).reshape(bs, self.world * k).long()
        return cand_vals, cand_ids

    def _draw(self, probs: torch.Tensor, bs: int, k: int) -> torch.Tensor:
        # exponential race with a seed shared by all ranks: every rank picks the same candidate
        if self._noise is None:
            self._noise = torch.empty(self.max_rows, self.max_k, dtype=torch.float32, device=self.device)  # ok: FC107
        noise = self._noise[:bs, :k]
        noise.exponential_(generator=self.generator)
        return torch.argmax(probs / noise, dim=-1)

    def _candidates(self, local_logits: torch.Tensor, params: SamplingTensors, bs: int, k: int):
        scaled = local_logits[:bs].float() / params.temperature[:bs, None]
        vals, ids = torch.topk(scaled, k, dim=-1)
        cand_vals, cand_ids = self._exchange(vals, ids + self.shard.start, bs, k)
        top_vals, pos = torch.topk(cand_vals, k, dim=-1)
        top_ids = torch.gather(cand_ids, 1, pos)
        rows = torch.arange(bs, device=self.device)
        row_of = torch.repeat_interleave(rows, torch.full_like(rows, k), output_size=bs * k)  # ok: FC101
        seen = self.presence[row_of, top_ids.flatten()].view(bs, k).float()
        top_vals = top_vals - params.presence_penalty[:bs, None] * seen
        ranks = torch.arange(k, device=self.device)
        top_vals = top_vals.masked_fill(ranks[None, :] >= params.top_k[:bs, None], float("-inf"))
        return top_vals, top_ids

    def _top_p(self, probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
        cum = probs.cumsum(-1)
        return probs.masked_fill(cum - probs > top_p[:, None], 0.0)

    def sample(self, local_logits: torch.Tensor, params: SamplingTensors, bs: int) -> torch.Tensor:
        k = params.k_cap
        need = self.world * bs * k * 2
        if need > self.gather_buf.numel():
            self.gather_buf = torch.empty(need, dtype=torch.float32, device=self.device)  # expect: FC107
        top_vals, top_ids = self._candidates(local_logits, params, bs, k)
        probs = torch.softmax(top_vals, dim=-1)
        needs_top_p = bool((params.top_p[:bs] < 1.0).any())  # expect: FC101
        if needs_top_p:
            probs = self._top_p(probs, params.top_p[:bs])
        choice = self._draw(probs, bs, k)
        return torch.gather(top_ids, 1, choice[:, None]).squeeze(1)

    def sample_static(self, local_logits: torch.Tensor, params: SamplingTensors, bs: int) -> torch.Tensor:
        """Graph-safe: fixed k, top-p always applied."""
        k = self.max_k
        top_vals, top_ids = self._candidates(local_logits, params, bs, k)
        probs = self._top_p(torch.softmax(top_vals, dim=-1), params.top_p[:bs])
        choice = self._draw(probs, bs, k)
        return torch.gather(top_ids, 1, choice[:, None]).squeeze(1)
