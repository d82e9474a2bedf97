"""Prefill and decode steps; speculative verification runs eagerly."""
from __future__ import annotations

from typing import List

import flashcheck
import torch

from mla_fp8 import LatentCache, MLAConfig, ScaleBuffer
from mla_attn.backend import FP8MLABackend
from mla_attn.meta import MLADecodeMeta
from mla_run.graph_runner import MLAGraphRunner
from mla_run.model import MLAModel


class MLAEngine:
    def __init__(self, cfg: MLAConfig, device: torch.device, eos_token_id: int) -> None:
        self.cfg, self.device = cfg, device
        self.eos_ids = torch.tensor([eos_token_id], dtype=torch.int64, device=device)
        fp8 = torch.float8_e4m3fn
        self.caches: List[LatentCache] = [
            LatentCache(
                torch.zeros(cfg.num_pages, cfg.page_size, cfg.kv_lora_rank, dtype=fp8, device=device),
                torch.zeros(cfg.num_pages, cfg.page_size, cfg.qk_rope_head_dim, dtype=fp8, device=device),
                ScaleBuffer(cfg.num_pages, cfg.page_size, device),
            )
            for _ in range(cfg.num_layers)
        ]
        self.backend = FP8MLABackend(cfg, device)
        self.model = MLAModel(cfg, self.backend, self.caches, device).to(device)
        self.model.load_absorbed()
        self.graph_runner = MLAGraphRunner(self.model, self.backend, cfg, device)
        for q_len in (1, 1 + cfg.num_spec_tokens):
            for bs in sorted(cfg.graph_buckets, reverse=True):
                self.graph_runner.record(bs, q_len)

    def prefill_step(
        self, input_ids: torch.Tensor, slots: torch.Tensor, qo_indptr_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor
    ) -> torch.Tensor:
        longest = int(seq_lens_cpu.max())  # ok: FC101
        if longest > self.cfg.max_pages_per_seq * self.cfg.page_size:
            raise ValueError(f"prompt of {longest} tokens exceeds the page table")
        self.backend.plan_prefill(qo_indptr_cpu)
        return self.model.forward_prefill(input_ids, slots)[qo_indptr_cpu[1:] - 1]

    def decode_step(self, meta: MLADecodeMeta, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        if meta.num_seqs > self.cfg.max_graph_bs:
            self.backend.plan_verify(meta)
            logits = self.model.forward_decode(input_ids, slots)
        else:
            logits = self.graph_runner.replay(meta, input_ids, slots)
            # the next step decodes one more token per row
            self.backend.kv_len_buf[: meta.num_seqs] += 1  # expect: FC104
        return logits.argmax(dim=-1)

    @flashcheck.hot_path
    def collect_finished(self, next_ids: torch.Tensor) -> torch.Tensor:
        finished = next_ids == self.eos_ids
        return torch.nonzero(finished).flatten()  # expect: FC101

    def serve_once(self, meta: MLADecodeMeta, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        next_ids = self.decode_step(meta, input_ids, slots)
        return self.collect_finished(next_ids)
