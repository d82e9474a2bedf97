"""One TP rank's worker: per-rank attention metadata, decode, vocabulary-parallel sampling."""
from __future__ import annotations

import torch

from vpsample.attn.metadata import RankAttnMetadata, advance_lengths
from vpsample.config import TPServeConfig
from vpsample.dist import TPGroup
from vpsample.layout import shard_for_rank
from vpsample.sampling.params import SamplingTensors
from vpsample.sampling.sampler import VocabParallelSampler
from vpsample.step import RankStep
from vp_runtime.graphs import SamplerGraphs
from vp_runtime.model import VocabParallelLM


class TPWorker:
    def __init__(self, cfg: TPServeConfig, rank: int, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.group = TPGroup(rank, cfg.tp_size)
        shard = shard_for_rank(cfg.vocab_size, cfg.tp_size, rank)
        self.meta = RankAttnMetadata(cfg, rank, self.device)
        self.model = VocabParallelLM(cfg, self.meta, self.group, shard, self.device).to(self.device)
        self.sampler = VocabParallelSampler(shard, self.group, cfg.max_batch_size, max(cfg.graph_buckets), self.device)
        self.graphs = SamplerGraphs(cfg, self.model, self.meta, self.sampler, self.device)
        self.vocab_usage = torch.zeros(cfg.vocab_size, dtype=torch.int64, device=self.device)
        self.out_page = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=self.device)
        self.out_off = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=self.device)

    def warmup(self) -> None:
        self.graphs.record_all()

    def execute_step(self, step: RankStep, params: SamplingTensors, out_slots_cpu: torch.Tensor) -> torch.Tensor:
        bs = step.num_rows
        self.out_page[:bs].copy_(out_slots_cpu[0, :bs], non_blocking=True)
        self.out_off[:bs].copy_(out_slots_cpu[1, :bs], non_blocking=True)
        padded = self.graphs.bucket_for(bs)
        if padded is not None and padded in self.graphs.graphs:
            self.meta.refresh(step, padded)
            next_ids = self.graphs.replay_bucket(step, params, self.out_page[:bs], self.out_off[:bs], padded)
        else:
            self.meta.refresh_eager(step)
            local_logits = self.model.decode(step.input_ids, step.positions, self.out_page[:bs], self.out_off[:bs], bs)
            next_ids = self.sampler.sample(local_logits, params, bs)
        self.sampler.presence[:bs].scatter_(1, next_ids[:, None], 1)
        used = torch.unique(next_ids)  # expect: FC101
        self.vocab_usage.index_add_(0, used, torch.ones_like(used))
        # the next step's graph reads advanced lengths even where its plan is skipped
        advance_lengths(self.meta.last_page_len_buf[:bs], self.cfg.page_size)  # expect: FC104
        return next_ids
