"""A per-step metrics hook: rows, padding, pages."""

import logging
from typing import List

import torch
from flashcheck import hot_path

from kvbatch.batcher import FormedBatch
from kvbatch.config import knobs

logger = logging.getLogger(__name__)


class MetricsHook:
    def __init__(self, page_budget: int):
        self.page_budget = page_budget
        self.steps = 0
        self.padded_rows = 0
        self.page_history: List[torch.Tensor] = []

    @hot_path
    def on_step(self, step: int, batch: FormedBatch) -> None:
        if batch.num_pages_host > self.page_budget:
            raise RuntimeError(f"batch over the page budget: {batch.page_counts}")  # ok: FC101
        self.steps += 1
        self.padded_rows += batch.padded - batch.num_rows
        if step % knobs.log_every == 0:
            logger.info(f"step={step} rows={batch.num_rows}/{batch.padded} pages={batch.page_counts.sum()}")  # expect: FC101
        self.page_history.append(batch.page_counts)

    def summary(self) -> dict:
        pages = torch.cat(self.page_history).tolist() if self.page_history else []  # ok: FC101
        return {
            "steps": self.steps,
            "padded_rows": self.padded_rows,
            "mean_pages_per_row": sum(pages) / max(len(pages), 1),
        }
