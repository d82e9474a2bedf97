"""Per-step metadata: meant to touch only the pinned / numpy mirrors, then upload once."""

import logging

import numpy as np
import torch

from engine_rt.batch import ForwardBatch, Request
from shmirror.config import EngineConfig
from shmirror.helpers.indptr import cumsum_indptr
from shmirror.helpers.pages import last_page_lens, pages_per_seq, total_pages
from shmirror.mirrors import MirrorBank

logger = logging.getLogger(__name__)


class StepMetadataBuilder:
    def __init__(self, cfg: EngineConfig, mirror: MirrorBank, device):
        self.cfg = cfg
        self.mirror = mirror
        self.device = device
        self.page_size = cfg.page_size

    def _ensure_capacity(self, bs: int):
        if bs <= self.mirror.capacity:
            return
        new_cap = max(bs, 2 * self.mirror.capacity)
        logger.info("growing step mirrors %d -> %d", self.mirror.capacity, new_cap)
        self.mirror.seq_lens_dev = torch.zeros(new_cap, dtype=torch.int32, device=self.device)  # expect: FC107
        self.mirror.seq_lens_pinned = torch.zeros(new_cap, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.mirror.seq_lens_np = self.mirror.seq_lens_pinned.numpy()
        self.mirror.capacity = new_cap

    def _write_slots(self, reqs: list, positions_np: np.ndarray, row_of_token: np.ndarray):
        ps = self.page_size
        pages = np.empty(positions_np.shape[0], dtype=np.int64)
        for t in range(positions_np.shape[0]):
            req = reqs[row_of_token[t]]
            pages[t] = req.page_ids[positions_np[t] // ps]
        offsets = positions_np % ps
        return (
            torch.from_numpy(pages).to(self.device, non_blocking=True),
            torch.from_numpy(offsets.astype(np.int64)).to(self.device, non_blocking=True),
        )

    def prepare_step(self, reqs: list, is_decode: bool) -> ForwardBatch:
        bs = len(reqs)
        ps = self.page_size
        self._ensure_capacity(bs)
        self.mirror.stage_lengths([r.seq_len for r in reqs])
        lens_np = self.mirror.seq_lens_np[:bs]
        if lens_np.max() > self.cfg.max_seq_len:  # ok: FC101
            raise ValueError(f"a sequence exceeds max_seq_len={self.cfg.max_seq_len}")
        lens_host = self.mirror.seq_lens_pinned[:bs]

        # page table on the host, then one non_blocking upload
        kv_indptr = cumsum_indptr(pages_per_seq(lens_host, ps))
        total = int(kv_indptr[-1])  # ok: FC101
        if total != total_pages(lens_host, ps):
            raise RuntimeError("indptr and page table disagree on the page count")
        self.mirror.kv_indptr_cpu[: bs + 1] = kv_indptr
        page_ids = np.concatenate([r.page_ids[: (r.seq_len + ps - 1) // ps] for r in reqs]).astype(np.int32)
        self.mirror.kv_indices_cpu[:total] = torch.from_numpy(page_ids)
        self.mirror.kv_last_page_cpu[:bs] = last_page_lens(lens_host, ps)
        self.mirror.push(bs)
        kv_indices = self.mirror.kv_indices_cpu[:total].to(self.device, non_blocking=True)

        if is_decode:
            positions_np = (lens_np - 1).astype(np.int64)
            pages, offsets = self._write_slots(reqs, positions_np, np.arange(bs))
            input_ids = torch.tensor([r.last_token for r in reqs], dtype=torch.long).to(self.device, non_blocking=True)
            return ForwardBatch(
                input_ids=input_ids,
                positions=torch.from_numpy(positions_np).to(self.device, non_blocking=True),
                seq_lens=self.mirror.seq_lens_dev[:bs],
                seq_lens_cpu=lens_host,
                kv_indices=kv_indices,
                write_pages=pages,
                write_offsets=offsets,
                is_decode=True,
                num_tokens=bs,
            )

        extend_lens = torch.tensor([r.extend_len for r in reqs], dtype=torch.int32).to(self.device, non_blocking=True)
        qo_indptr = cumsum_indptr(extend_lens)
        num_tokens = int(qo_indptr[-1])  # expect: FC101
        ids_np = np.concatenate([np.asarray(r.token_ids[r.seq_len - r.extend_len :]) for r in reqs]).astype(np.int64)
        pos_np = np.concatenate([np.arange(r.seq_len - r.extend_len, r.seq_len) for r in reqs]).astype(np.int64)
        rows_np = np.repeat(np.arange(bs), [r.extend_len for r in reqs])
        pages, offsets = self._write_slots(reqs, pos_np, rows_np)
        return ForwardBatch(
            input_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(self.device, non_blocking=True),
            seq_lens=self.mirror.seq_lens_dev[:bs],
            seq_lens_cpu=lens_host,
            kv_indices=kv_indices,
            write_pages=pages,
            write_offsets=offsets,
            is_decode=False,
            extend_lens=extend_lens,
            qo_indptr=qo_indptr,
            num_tokens=num_tokens,
        )

    def requests_fit(self, reqs: list) -> bool:
        return all(isinstance(r, Request) and r.seq_len <= self.cfg.max_seq_len for r in reqs)
