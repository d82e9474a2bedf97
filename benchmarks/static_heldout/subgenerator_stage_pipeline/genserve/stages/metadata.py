"""Build the step's attention metadata: host mirrors first, one upload each."""

from __future__ import annotations

from typing import Generator, Optional

import numpy as np
import torch

from ..attention import AttentionBackend
from ..batch import ScheduledBatch, SharedPrefix, StageEvent, StepMeta
from ..buffers import StepBuffers
from ..config import EngineConfig


class MetadataStage:
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend, bufs: StepBuffers) -> None:
        self.cfg = cfg
        self.backend = backend
        self.bufs = bufs
        self.device = torch.device(cfg.device)

    def _shared_prefix(self, batch: ScheduledBatch) -> Optional[SharedPrefix]:
        if not batch.is_prefill:
            return None
        shared = {r.shared_prefix_pages for r in batch.requests}
        if len(shared) != 1 or 0 in shared:
            return None
        n = shared.pop()
        pages_host = torch.tensor(batch.requests[0].pages[:n], dtype=torch.int32)
        return SharedPrefix(
            qo_indptr_cpu=torch.tensor([0, batch.num_tokens], dtype=torch.int32),
            kv_indptr_cpu=torch.tensor([0, n], dtype=torch.int32),
            kv_indices=pages_host.to(self.device, non_blocking=True),
            last_page_len=self.cfg.page_size,
        )

    def prepare_metadata(self, batch: ScheduledBatch) -> Generator[StageEvent, None, StepMeta]:
        cfg = self.cfg
        bs = batch.batch_size
        bucket = None if batch.is_prefill else cfg.bucket_for(bs)
        rows = bucket or bs

        # paged-KV tables on the host, padded to the bucket (padding rows hold no pages)
        page_counts = batch.num_pages_cpu.tolist()  # ok: FC101
        lens_np = batch.seq_lens_cpu.numpy()
        indptr_host = self.backend.kv_indptr_host[: rows + 1]
        last_host = self.backend.kv_last_page_len_host[:rows]
        indptr_np = np.zeros(rows + 1, dtype=np.int32)
        np.cumsum(page_counts, out=indptr_np[1 : bs + 1])
        indptr_np[bs + 1 :] = indptr_np[bs]
        indptr_host.copy_(torch.from_numpy(indptr_np))
        last_host[:bs].copy_(torch.from_numpy(((lens_np - 1) % cfg.page_size + 1).astype(np.int32)))
        qo_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(batch.qo_lens_cpu, 0, out=qo_host[1:])
        max_len = int(batch.seq_lens.max())  # expect: FC101

        # token inputs: stage in pinned memory, one async upload into the shared step buffers
        n = batch.num_tokens
        if self.bufs.positions.numel() < n:
            self.bufs.positions = torch.empty(n, dtype=torch.int64, device=self.device)  # expect: FC107
        if self.bufs.token_host.numel() < n:
            self.bufs.token_host = torch.empty(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        staged = self.bufs.token_host[:n]
        staged.copy_(batch.input_ids_cpu)
        input_ids = self.bufs.input_ids[:n]
        input_ids.copy_(staged, non_blocking=True)
        positions = self.bufs.positions[:n]
        positions.copy_(batch.positions_cpu, non_blocking=True)

        yield StageEvent("metadata", rows)

        kv_indices = torch.from_numpy(batch.page_table).to(self.device, non_blocking=True)
        return StepMeta(
            batch_size=bs,
            bucket=bucket,
            is_prefill=batch.is_prefill,
            input_ids=input_ids,
            positions=positions,
            seq_lens=batch.seq_lens,
            qo_indptr=qo_host.to(self.device, non_blocking=True),
            qo_indptr_cpu=qo_host,
            kv_indptr_cpu=indptr_host,
            kv_indices=kv_indices,
            kv_last_page_len_cpu=last_host,
            max_len=max_len,
            shared_prefix=self._shared_prefix(batch),
        )
