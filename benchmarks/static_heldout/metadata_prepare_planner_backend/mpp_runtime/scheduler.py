"""Builds each step's ForwardInput on the host and stages it to the device."""
from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional, Protocol

import numpy as np
import torch

from mpp import BackendConfig, ForwardInput, PrefillInput, last_page_lens, pages_needed


class StatsSink(Protocol):
    def record(self, step: int, seq_lens: torch.Tensor) -> None: ...


class DeviceStatsSink:
    """Keeps the last lines of per-step statistics for the /debug endpoint."""

    def __init__(self, max_lines: int = 4096):
        self.lines: deque = deque(maxlen=max_lines)

    def record(self, step: int, seq_lens: torch.Tensor) -> None:
        self.lines.append(f"step {step}: seq_lens={seq_lens}")  # expect: FC101


class NullStatsSink:
    def record(self, step: int, seq_lens: torch.Tensor) -> None:
        return None


@dataclass
class Req:
    rid: int
    prompt_len: int
    pages: List[int] = field(default_factory=list)
    output: List[int] = field(default_factory=list)
    last_token: int = 0

    @property
    def seq_len(self) -> int:
        return self.prompt_len + len(self.output)


class StepScheduler:
    def __init__(self, cfg: BackendConfig, device: torch.device, sink: StatsSink):
        self.cfg = cfg
        self.device = device
        self.sink = sink
        self.running: List[Req] = []
        self.step_no = 0
        self.qo_arange_stage = torch.arange(cfg.max_batch_size + 1, dtype=torch.int32).pin_memory()

    def build_prefill(self, reqs: List[Req], prompts: List[List[int]], slots: List[int]) -> PrefillInput:
        dev = self.device
        lens = [len(p) for p in prompts]
        qo = np.zeros(len(lens) + 1, dtype=np.int32)
        np.cumsum(lens, out=qo[1:])
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        return PrefillInput(
            input_ids=torch.from_numpy(ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            req_slots=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            extend_lens=torch.tensor(lens, dtype=torch.int64).to(dev, non_blocking=True),
            qo_indptr=torch.from_numpy(qo).to(dev, non_blocking=True),
            extend_lens_list=lens,
            num_tokens=int(qo[-1]),
        )

    def next_batch(self) -> Optional[ForwardInput]:
        if not self.running:
            return None
        cfg, dev = self.cfg, self.device
        reqs = self.running[: cfg.max_batch_size]
        bs = len(reqs)
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        pages = pages_needed(lens, cfg.page_size)
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        width = int(pages.max())
        table = np.zeros((bs, width), dtype=np.int32)
        for i, r in enumerate(reqs):
            table[i, : pages[i]] = r.pages[: pages[i]]
        flat = np.concatenate([table[i, : pages[i]] for i in range(bs)])
        last_slot = (lens - 1) % cfg.page_size
        out_loc = table[np.arange(bs), (lens - 1) // cfg.page_size].astype(np.int64) * cfg.page_size + last_slot

        seq_lens_stage = torch.from_numpy(lens).pin_memory()
        fwd = ForwardInput(
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.from_numpy(lens - 1).to(dev, non_blocking=True),
            seq_lens=seq_lens_stage.to(dev, non_blocking=True),
            kv_indices=torch.from_numpy(flat).to(dev, non_blocking=True),
            block_table=torch.from_numpy(table).to(dev, non_blocking=True),
            out_cache_loc=torch.from_numpy(out_loc).to(dev, non_blocking=True),
            seq_lens_stage=seq_lens_stage,
            kv_indptr_stage=torch.from_numpy(indptr).pin_memory(),
            qo_indptr_stage=self.qo_arange_stage[: bs + 1],
            last_page_len_stage=last_page_lens(seq_lens_stage, cfg.page_size),
        )
        self.step_no += 1
        self.sink.record(self.step_no, fwd.seq_lens)
        return fwd
