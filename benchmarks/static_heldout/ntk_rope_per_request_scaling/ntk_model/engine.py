"""The engine: prefill and oversized decode batches run eagerly, the rest replay bucket graphs."""

import torch

from ntkserve import NTKConfig
from ntkserve.batch import StepBatch, build_step_batch
from ntk_attn.backend import NTKAttentionBackend
from ntk_model.graph_runner import DecodeGraphRunner
from ntk_model.model import NTKModel


class NTKEngine:
    def __init__(self, cfg: NTKConfig, kv_cache: torch.Tensor, device: str = "cuda"):
        self.cfg = cfg
        self.backend = NTKAttentionBackend(cfg, torch.device(device))
        self.model = NTKModel(cfg, self.backend).to(device)
        self.kv_cache = kv_cache
        self.runner = DecodeGraphRunner(cfg, self.model, self.backend, kv_cache)
        self.max_graph_bs = max(cfg.buckets)

    def make_batch(self, slots, token_ids, seq_lens, page_tables, is_prefill=False) -> StepBatch:
        c = self.cfg
        return build_step_batch(
            slots, token_ids, seq_lens, page_tables, c.page_size, c.long_row_threshold, self.backend.device, is_prefill
        )

    def warmup(self) -> None:
        self.runner.capture_all()

    def step(self, batch: StepBatch) -> torch.Tensor:
        if batch.is_prefill:
            self.backend.init_forward_metadata(batch)
            return self.model.forward_prefill(batch.tokens_dev, batch.positions_dev, self.kv_cache)
        if batch.batch_size <= self.max_graph_bs:
            return self.runner.replay(batch)
        self.backend.init_forward_metadata(batch)
        row_alpha = self.backend.alpha_scratch[: batch.batch_size]
        return self.model.forward_decode(
            batch.tokens_dev, batch.positions_dev, row_alpha, self.kv_cache, batch.batch_size, batch.num_long
        )

    def release(self, slot: int, row: int) -> None:
        """A finished request gives back its slot; its decode row keeps a harmless page length."""
        self.backend.scales.set_factor(slot, 1.0)
        self.backend.last_page_len_buf[row] = 1  # expect: FC104

    def report(self) -> dict:
        stats = {"scaled_replays": self.runner.scaled_replays}
        stats.update(self.backend.scales.dump())
        return stats
