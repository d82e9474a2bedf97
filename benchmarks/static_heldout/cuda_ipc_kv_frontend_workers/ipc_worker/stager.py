"""Stages a StepMessage's numpy arrays into pinned memory and on to the device."""

from dataclasses import dataclass

import numpy as np
import torch

from ipckv import IpcServeConfig, StepMessage


@dataclass
class StagedBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor


class BatchStager:
    def __init__(self, cfg: IpcServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        nb, nt = cfg.max_batch + 1, cfg.max_num_tokens
        self.ids_pinned = torch.zeros(nt, dtype=torch.int64, pin_memory=True)
        self.pos_pinned = torch.zeros(nt, dtype=torch.int64, pin_memory=True)
        self.lens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.qo_pinned = torch.zeros(nb, dtype=torch.int32, pin_memory=True)
        self.kv_pinned = torch.zeros(nb, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.max_pages, dtype=torch.int32, pin_memory=True)
        self.ids_np = self.ids_pinned.numpy()
        self.pos_np = self.pos_pinned.numpy()
        self.lens_np = self.lens_pinned.numpy()
        self.qo_np = self.qo_pinned.numpy()
        self.kv_np = self.kv_pinned.numpy()
        self.last_np = self.last_pinned.numpy()
        self.indices_np = self.indices_pinned.numpy()
        self.indices_dev = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)

    def stage(self, msg: StepMessage) -> StagedBatch:
        bs = len(msg.req_ids)
        n = len(msg.input_ids_np)
        ps = self.cfg.page_size
        self.ids_np[:n] = msg.input_ids_np
        self.pos_np[:n] = msg.positions_np
        self.lens_np[:bs] = msg.seq_lens_np
        self.qo_np[: bs + 1] = msg.qo_indptr_np
        pages = (msg.seq_lens_np + ps - 1) // ps
        self.kv_np[0] = 0
        np.cumsum(pages, out=self.kv_np[1 : bs + 1])
        for i in range(bs):
            self.indices_np[self.kv_np[i] : self.kv_np[i + 1]] = msg.page_table_np[i, : pages[i]]
        self.last_np[:bs] = msg.seq_lens_np - (pages - 1) * ps
        nnz = int(self.kv_np[bs])
        self.indices_dev[:nnz].copy_(self.indices_pinned[:nnz], non_blocking=True)
        return StagedBatch(
            batch_size=bs,
            input_ids=self.ids_pinned[:n].to(self.device, non_blocking=True),
            positions=self.pos_pinned[:n].to(self.device, non_blocking=True),
            seq_lens=self.lens_pinned[:bs].to(self.device, non_blocking=True),
            qo_indptr=self.qo_pinned[: bs + 1].to(self.device, non_blocking=True),
            qo_indptr_cpu=self.qo_pinned[: bs + 1],
            kv_indptr_cpu=self.kv_pinned[: bs + 1],
            kv_indices=self.indices_dev[:nnz],
            last_page_len_cpu=self.last_pinned[:bs],
            block_tables=torch.from_numpy(msg.page_table_np).to(self.device, non_blocking=True),
        )
