"""Per-step attention metadata of the language model and its builder."""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from vlm import PromptBatch, VLMConfig, image_token_positions


@dataclass
class PrefillMeta:
    qo_indptr: torch.Tensor  # device copy: the M-RoPE position kernel reads it
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    num_tokens: int
    image_positions: Optional[torch.Tensor] = None


@dataclass
class DecodeMeta:
    batch_size: int
    padded_bs: int
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor
    positions: torch.Tensor  # on the device


class LMMetadataBuilder:
    def __init__(self, cfg: VLMConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.page_size = cfg.page_size
        self.buckets = list(cfg.decode_buckets)
        max_rows = max(cfg.max_batch, self.buckets[-1]) * 4
        self.indptr_host = torch.zeros(max_rows + 1, dtype=torch.int32, pin_memory=True)
        self.last_host = torch.ones(max_rows, dtype=torch.int32, pin_memory=True)
        self._indptr = self.indptr_host.numpy()
        self._last = self.last_host.numpy()

    def bucket_for(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        return bs  # eager: past the largest bucket

    def build(self, batch: PromptBatch) -> PrefillMeta:
        n_img = int(batch.num_image_tokens_cpu.sum())  # ok: FC101
        image_pos = None
        if n_img:
            image_pos = image_token_positions(batch.input_ids, self.cfg.image_token_id)
        return PrefillMeta(
            qo_indptr=batch.qo_indptr_host.to(self.device, non_blocking=True),
            qo_indptr_host=batch.qo_indptr_host,
            kv_indptr_host=batch.kv_indptr_host,
            kv_indices=batch.kv_indices,
            last_page_len_host=batch.last_page_len_host,
            num_tokens=int(batch.qo_indptr_host[-1]),
            image_positions=image_pos,
        )

    def build_decode(
        self, seq_lens_host: np.ndarray, page_tables: List[np.ndarray], positions: torch.Tensor
    ) -> DecodeMeta:
        bs = len(seq_lens_host)
        padded = self.bucket_for(bs)
        pages = (seq_lens_host + self.page_size - 1) // self.page_size
        self._indptr[0] = 0
        np.cumsum(pages, out=self._indptr[1 : bs + 1])
        self._indptr[bs + 1 : padded + 1] = self._indptr[bs]
        self._last[:bs] = seq_lens_host - (pages - 1) * self.page_size
        self._last[bs:padded] = 1
        flat = np.concatenate(page_tables).astype(np.int32)
        return DecodeMeta(
            batch_size=bs,
            padded_bs=padded,
            kv_indptr_host=self.indptr_host[: padded + 1],
            kv_indices=torch.from_numpy(flat).to(self.device, non_blocking=True),
            last_page_len_host=self.last_host[:padded],
            positions=positions,
        )
