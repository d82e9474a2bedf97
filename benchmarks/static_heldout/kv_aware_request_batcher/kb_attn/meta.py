"""Metadata builders: a generic base and the FlashInfer builder over the graph-bound buffers."""

from typing import Dict, Generic, List, TypeVar

import numpy as np
import torch

from kb_attn.backend import BatcherBackend
from kb_attn.records import FIMeta
from kvbatch.batcher import FormedBatch
from kvbatch.config import BatcherConfig

MetaT = TypeVar("MetaT")


class MetadataBuilder(Generic[MetaT]):
    def __init__(self, cfg: BatcherConfig, backend: BatcherBackend):
        self.cfg = cfg
        self.backend = backend
        self.device = cfg.device
        self.buckets = sorted(cfg.decode_buckets)

    def padded_size(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        return n

    def build(self, batch: FormedBatch) -> MetaT:
        raise NotImplementedError


class FlashInferBuilder(MetadataBuilder[FIMeta]):
    def __init__(self, cfg: BatcherConfig, backend: BatcherBackend):
        super().__init__(cfg, backend)
        max_bs = self.buckets[-1]
        self.indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        # batch row -> request slot; the captured graphs scatter tokens through it
        self.row_map = torch.full((max_bs,), -1, dtype=torch.int32, device=self.device)
        self.row_map_cpu = torch.full((max_bs,), -1, dtype=torch.int32, device="cpu")
        self.tables: Dict[int, np.ndarray] = {}
        self.seq_lens_np = np.zeros(cfg.max_slots, dtype=np.int32)

    def set_table(self, slot: int, pages: np.ndarray, seq_len: int) -> None:
        self.tables[slot] = pages.astype(np.int32)
        self.seq_lens_np[slot] = seq_len

    def dummy(self, bs: int) -> FIMeta:
        return FIMeta(
            num_rows=bs,
            padded=bs,
            kv_indptr=self.backend.indptr_buf[: bs + 1],
            kv_indptr_host=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=self.backend.indices_buf[:bs],
            last_page_len_host=torch.ones(bs, dtype=torch.int32),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            row_map_cpu=torch.arange(bs, dtype=torch.int32),
        )

    def build(self, batch: FormedBatch) -> FIMeta:
        n, padded = batch.num_rows, batch.padded
        slots: List[int] = batch.slots
        ind = self.indptr_host.numpy()
        ind[0] = 0
        np.cumsum([len(self.tables[s]) for s in slots], out=ind[1 : n + 1])
        ind[n + 1 : padded + 1] = ind[n]
        total_pages = int(self.indptr_host[n])  # ok: FC101
        lens = self.seq_lens_np[slots]
        last = self.last_host.numpy()
        last[:n] = (lens - 1) % self.cfg.page_size + 1
        last[n:padded] = 1
        self.row_map_cpu = torch.full((padded,), -1, dtype=torch.int32, device="cpu")  # ok: FC107
        self.row_map_cpu[:n] = torch.as_tensor(slots, dtype=torch.int32)
        self.row_map = torch.full((padded,), -1, dtype=torch.int32, device=self.device)  # expect: FC107
        self.row_map[:n].copy_(self.row_map_cpu[:n], non_blocking=True)
        flat = torch.from_numpy(np.concatenate([self.tables[s] for s in slots]))
        self.backend.indices_buf[:total_pages].copy_(flat, non_blocking=True)
        self.backend.indptr_buf[: padded + 1].copy_(self.indptr_host[: padded + 1], non_blocking=True)  # ok: FC104
        padded_lens = np.zeros(padded, dtype=np.int32)
        padded_lens[:n] = lens
        meta = FIMeta(
            num_rows=n,
            padded=padded,
            kv_indptr=self.backend.indptr_buf[: padded + 1],
            kv_indptr_host=self.indptr_host[: padded + 1],
            kv_indices=self.backend.indices_buf[:total_pages],
            last_page_len_host=self.last_host[:padded],
            seq_lens=torch.from_numpy(padded_lens).to(self.device, non_blocking=True),
            row_map_cpu=self.row_map_cpu,
        )
        meta.num_real = (meta.seq_lens > 0).sum()
        return meta
