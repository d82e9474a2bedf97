"""Sampler graphs per bucket: penalties, temperature, min-p, sampling and top-n logprobs."""

from __future__ import annotations

from typing import Dict

import torch

from sampling import (
    ModelConfig,
    SamplerOutput,
    SamplingTensors,
    apply_penalties,
    exponential_race,
    min_p_filter,
    topn_logprobs,
)


class SamplerGraphs:
    def __init__(self, cfg: ModelConfig, tensors: SamplingTensors, device: torch.device):
        self.cfg = cfg
        self.tensors = tensors
        self.device = device
        self.static_logits = torch.zeros(cfg.max_batch, cfg.vocab_size, dtype=torch.float32, device=device)
        self.static_counts = torch.zeros(cfg.max_batch, cfg.vocab_size, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, SamplerOutput] = {}

    def _sample(self, bs: int) -> SamplerOutput:
        t = self.tensors
        logits = apply_penalties(self.static_logits[:bs], self.static_counts[:bs], t.rep_pen[:bs], t.freq_pen[:bs])
        logits = logits / t.temperature[:bs].clamp(min=1e-5).unsqueeze(1)
        logits = min_p_filter(logits, t.min_p[:bs])
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = exponential_race(logprobs)
        tok_lp = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        ids, vals = topn_logprobs(logprobs, self.cfg.max_top_n)
        self.static_counts[:bs].scatter_add_(1, tokens.unsqueeze(1), torch.ones_like(tok_lp).unsqueeze(1))
        return SamplerOutput(tokens=tokens, logprobs=tok_lp, topn_ids=ids, topn_logprobs=vals)

    def capture_bucket(self, bs: int, stream: torch.cuda.Stream) -> None:
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph, stream=stream):
            self.outputs[bs] = self._sample(bs)
        self.graphs[bs] = graph

    def reset_rows(self, rows: torch.Tensor) -> None:
        self.static_counts.index_fill_(0, rows, 0.0)

    def replay_bucket(self, bs: int, n: int, logits: torch.Tensor) -> SamplerOutput:
        vocab = logits.shape[1]
        if self.static_counts.shape[1] < vocab:
            # added special tokens grew the vocabulary
            self.static_counts.resize_(self.cfg.max_batch, vocab)  # expect: FC107
        self.static_logits[:n, :vocab].copy_(logits)  # ok: FC104
        if getattr(self, "packed", None) is None:
            self.packed = torch.empty(self.cfg.max_batch, 1 + self.cfg.max_top_n, dtype=torch.int64, device=self.device)  # ok: FC107
        self.graphs[bs].replay()
        out = self.outputs[bs]
        self.packed[:n, 0].copy_(out.tokens[:n])
        self.packed[:n, 1:].copy_(out.topn_ids[:n])
        return SamplerOutput(
            tokens=out.tokens[:n], logprobs=out.logprobs[:n], topn_ids=out.topn_ids[:n],
            topn_logprobs=out.topn_logprobs[:n],
        )
