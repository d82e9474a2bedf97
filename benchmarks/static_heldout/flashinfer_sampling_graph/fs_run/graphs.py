"""Decode graphs that run the model and the sampler, one per (bucket, renorm) pair."""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fs_attn.backend import DecodeBackend, DecodeInputs
from fs_run.model import SampledLM
from fsample import GraphSampler, SamplingEngineConfig, StagedParams


@dataclass
class SamplingGraph:
    graph: torch.cuda.CUDAGraph
    tokens: torch.Tensor


@dataclass
class SampleOutput:
    tokens: torch.Tensor
    num_rows: int


class DecodeGraphRunner:
    def __init__(
        self,
        model: SampledLM,
        backend: DecodeBackend,
        sampler: GraphSampler,
        kv_cache: torch.Tensor,
        cfg: SamplingEngineConfig,
        pool=None,
    ):
        self.model = model
        self.backend = backend
        self.sampler = sampler
        self.kv_cache = kv_cache
        self.cfg = cfg
        self.pool = pool
        self.buckets = list(cfg.decode_buckets)
        self.max_bs = self.buckets[-1]
        dev = cfg.device
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_slots = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_temperature = torch.ones(self.max_bs, dtype=torch.float32, device=dev)
        self.static_top_k = torch.full((self.max_bs,), cfg.vocab_size, dtype=torch.int32, device=dev)
        self.static_top_p = torch.ones(self.max_bs, dtype=torch.float32, device=dev)
        self.static_seeds = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_offsets = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.static_tokens = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.capture_stream = torch.cuda.Stream(device=dev)
        self.graphs: Dict[Tuple[int, bool], SamplingGraph] = {}

    def bucket_for(self, rows: int) -> Optional[int]:
        for b in self.buckets:
            if b >= rows:
                return b
        return None

    def _dummy_inputs(self, bs: int) -> DecodeInputs:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        ones = torch.ones(bs, dtype=torch.int32)
        idx = torch.zeros(bs, dtype=torch.int32, device=self.cfg.device)
        return DecodeInputs(
            kv_indptr=indptr.to(self.cfg.device),
            kv_indptr_host=indptr,
            kv_indices=idx,
            last_page_len_host=ones,
            positions=self.static_positions[:bs],
            window_indptr_host=indptr,
            window_indices=idx,
            window_last_page_len_host=ones,
        )

    def _forward_and_sample(self, bs: int, renorm: bool) -> None:
        logits = self.model.forward_decode(
            self.static_input_ids[:bs], self.static_positions[:bs], self.kv_cache, self.static_slots[:bs]
        )
        tokens = self.sampler.sample(
            logits,
            self.static_temperature[:bs],
            self.static_top_k[:bs],
            self.static_top_p[:bs],
            self.static_seeds[:bs],
            self.static_offsets[:bs],
            renorm,
        )
        self.static_tokens[:bs].copy_(tokens)

    def capture_one_batch_size(self, bs: int, renorm: bool) -> None:
        self.backend.plan_bucket(bs, self._dummy_inputs(bs))
        with torch.cuda.stream(self.capture_stream):
            self._forward_and_sample(bs, renorm)  # warm-up
        self.capture_stream.synchronize()  # ok: FC101
        warm = self.static_tokens[:bs].tolist()  # expect: FC101
        if any(t < 0 or t >= self.cfg.vocab_size for t in warm):
            raise RuntimeError(f"warm-up sampled out-of-vocabulary tokens at bucket {bs}")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.capture_stream):
            self._forward_and_sample(bs, renorm)
        self.graphs[(bs, renorm)] = SamplingGraph(graph=g, tokens=self.static_tokens[:bs])

    def capture_all(self) -> None:
        for bs in reversed(self.buckets):
            for renorm in (False, True):
                self.capture_one_batch_size(bs, renorm)

    def replay(
        self, bs: int, meta: DecodeInputs, staged: StagedParams, input_ids: torch.Tensor, slots: torch.Tensor
    ) -> SampleOutput:
        n = staged.num_rows
        entry = self.graphs[(bs, self.sampler.needs_renorm(staged))]
        self.backend.plan_bucket(bs, meta)
        self.static_input_ids[:n].copy_(input_ids, non_blocking=True)
        self.static_positions[:n].copy_(meta.positions, non_blocking=True)
        self.static_slots[:n].copy_(slots, non_blocking=True)
        self.static_temperature[:n].copy_(staged.temperature)
        self.static_top_k[:n].copy_(staged.top_k)
        self.static_top_p[:n].copy_(staged.top_p)
        self.static_seeds[:n].copy_(staged.seeds)
        self.static_offsets[:n].copy_(staged.offsets)
        entry.graph.replay()
        return SampleOutput(tokens=entry.tokens[:n], num_rows=n)

    def run_eager(
        self, meta: DecodeInputs, staged: StagedParams, input_ids: torch.Tensor, slots: torch.Tensor
    ) -> SampleOutput:
        self.backend.plan_eager(meta)
        logits = self.model.forward_decode(input_ids, meta.positions, self.kv_cache, slots)
        return SampleOutput(tokens=self.sampler.sample_eager(logits, staged), num_rows=staged.num_rows)
