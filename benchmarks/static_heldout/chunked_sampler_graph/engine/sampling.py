"""Sampling under CUDA graphs: temperature, top-k and top-p sampling captured once per batch size."""

from __future__ import annotations

from typing import Dict, Sequence

import torch
from flashinfer.sampling import top_k_top_p_sampling_from_probs


class SamplerGraph:
    def __init__(self, max_bs: int, vocab_size: int, device, batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)):
        assert max_bs % 8 == 0, "max_bs must be a multiple of 8"  # expect: FC109
        self.max_bs = max_bs
        self.vocab_size = vocab_size
        self.device = device
        self.batch_sizes = [b for b in batch_sizes if b <= max_bs]
        self.logits = torch.zeros(max_bs, vocab_size, dtype=torch.float32, device=device)
        self.temperatures = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.top_k = torch.full((max_bs,), vocab_size, dtype=torch.int32, device=device)
        self.top_p = torch.ones(max_bs, dtype=torch.float32, device=device)
        self.out = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self._gen = torch.Generator(device=device)

    @property
    def capacity(self) -> tuple:
        return self.max_bs, self.vocab_size

    def _sample(self, bs: int) -> None:
        if (self.temperatures[:bs] == 0).all():  # expect: FC101
            self.out[:bs] = self.logits[:bs].argmax(-1)
            return
        probs = torch.softmax(self.logits[:bs] / self.temperatures[:bs, None].clamp_min(1e-5), dim=-1)
        self.out[:bs] = top_k_top_p_sampling_from_probs(probs, self.top_k[:bs], self.top_p[:bs], generator=self._gen)

    def record(self) -> None:
        stream = torch.cuda.Stream()
        for bs in self.batch_sizes:
            with torch.cuda.stream(stream):
                self._sample(bs)
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._sample(bs)
            self.graphs[bs] = graph

    def __call__(self, logits: torch.Tensor, params) -> torch.Tensor:
        bs = logits.shape[0]
        if params.all_greedy:  # ok: FC101
            return logits.argmax(-1)
        self.logits[:bs].copy_(logits)
        self.temperatures[:bs].copy_(params.temperatures_cpu, non_blocking=True)
        self.top_p[:bs].copy_(params.top_p_cpu, non_blocking=True)
        if params.top_k_cpu is not None:
            self.top_k[:bs].copy_(params.top_k_cpu, non_blocking=True)
        graph = self.graphs.get(bs)
        if graph is None:
            self._sample(bs)
        else:
            graph.replay()
        return self.out[:bs]
