"""The serving loop: graphs for bucketed decode, the eager sparse path beyond them."""

from __future__ import annotations

import numpy as np
import torch

from nsa import LightningIndexer, SparseConfig
from nsa_attn.backend import SparseDecodeBackend
from nsa_attn.metadata import DecodeBatch, PrefillBatch
from nsa_run.graph_runner import SparseGraphRunner
from nsa_run.model import SparseDecoder


def make_decode_batch(
    block_table_np: np.ndarray, num_pages_np: np.ndarray, last_page_len_np: np.ndarray,
    seq_lens_np: np.ndarray, hidden: torch.Tensor, page_keys: torch.Tensor, device: torch.device,
) -> DecodeBatch:
    flat_np = np.concatenate([row[:n] for row, n in zip(block_table_np, num_pages_np)])
    return DecodeBatch(
        batch_size=len(num_pages_np),
        hidden=hidden,
        block_table=torch.from_numpy(block_table_np).to(device, non_blocking=True),
        num_pages=torch.from_numpy(num_pages_np).to(device, non_blocking=True),
        num_pages_np=num_pages_np,
        flat_pages=torch.from_numpy(flat_np).to(device, non_blocking=True),
        seq_lens_cpu=torch.from_numpy(seq_lens_np),
        last_page_len_cpu=torch.from_numpy(last_page_len_np),
        page_keys=page_keys,
    )


def build_engine(cfg: SparseConfig, device: torch.device) -> "SparseEngine":
    indexer = LightningIndexer(cfg.hidden_size, cfg.index_heads, cfg.index_dim, cfg.page_size).to(device)
    backend = SparseDecodeBackend(cfg, indexer, device)
    return SparseEngine(cfg, backend, device)


class SparseEngine:
    def __init__(self, cfg: SparseConfig, backend: SparseDecodeBackend, device: torch.device):
        self.cfg = cfg
        self.backend = backend
        self.model = SparseDecoder(cfg, backend).to(device)
        total_pages = cfg.max_batch * cfg.max_pages_per_req
        self.kv_cache = torch.zeros(
            cfg.num_layers, total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.page_keys = torch.zeros(total_pages, cfg.index_dim, dtype=torch.bfloat16, device=device)
        backend.attach_page_keys(self.page_keys)
        self.runner = SparseGraphRunner(cfg, self.model, backend, self.kv_cache, device)

    def warmup(self) -> None:
        self.runner.capture_all()

    def decode_step(self, batch: DecodeBatch, input_ids: torch.Tensor) -> torch.Tensor:
        if batch.batch_size <= self.cfg.buckets[-1]:
            return self.runner.replay(batch, input_ids)
        self.backend.init_forward_metadata(batch)
        return self.model.forward_decode(input_ids, self.kv_cache)

    def prefill_step(self, batch: PrefillBatch, input_ids: torch.Tensor) -> torch.Tensor:
        self.backend.plan_prefill(batch)
        return self.model.forward_extend(input_ids, self.kv_cache)
