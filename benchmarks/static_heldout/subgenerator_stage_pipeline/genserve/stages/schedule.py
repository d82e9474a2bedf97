"""Pick the requests of the next step and ask the driver for their pages."""

from __future__ import annotations

from typing import Generator, List

import numpy as np
import torch

from ..batch import PageGrant, Request, ScheduledBatch, StageEvent
from ..config import EngineConfig


class ScheduleStage:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device

    def _pages_needed(self, req: Request) -> int:
        total = -(-(req.seq_len + 1) // self.cfg.page_size)
        return max(total - len(req.pages), 0)

    def schedule(self, active: List[Request]) -> Generator[StageEvent, PageGrant, ScheduledBatch]:
        assert all(r.prompt_len > 0 for r in active), "empty prompt in the active queue"  # expect: FC109
        prefill = [r for r in active if r.is_prefill]
        take = (prefill or list(active))[: self.cfg.max_batch_size]
        is_prefill = bool(prefill)
        counts = [self._pages_needed(r) for r in take]

        grant = yield StageEvent("alloc", sum(counts))
        if (grant.page_ids < 0).any():  # expect: FC101
            raise RuntimeError(f"page pool exhausted: {sum(counts)} pages requested")
        fresh = grant.page_ids_cpu.tolist()  # ok: FC101
        for req, n in zip(take, counts):
            req.pages.extend(fresh[:n])
            fresh = fresh[n:]

        input_ids: List[int] = []
        positions: List[int] = []
        qo_lens: List[int] = []
        for req in take:
            if is_prefill:
                input_ids.extend(req.prompt_ids)
                positions.extend(range(req.prompt_len))
                qo_lens.append(req.prompt_len)
            else:
                input_ids.append(req.output_ids[-1])
                positions.append(req.seq_len - 1)
                qo_lens.append(1)
        seq_lens_cpu = torch.tensor([r.seq_len for r in take], dtype=torch.int32)
        page_table = np.fromiter((p for r in take for p in r.pages), dtype=np.int32)
        return ScheduledBatch(
            requests=take,
            is_prefill=is_prefill,
            input_ids_cpu=torch.tensor(input_ids, dtype=torch.int64),
            positions_cpu=torch.tensor(positions, dtype=torch.int64),
            qo_lens_cpu=torch.tensor(qo_lens, dtype=torch.int32),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            num_pages_cpu=torch.tensor([len(r.pages) for r in take], dtype=torch.int32),
            page_table=page_table,
        )
