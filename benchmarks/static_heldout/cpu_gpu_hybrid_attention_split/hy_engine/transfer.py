"""Moves the host's partial outputs to the GPU on a copy stream."""

import torch

from hy_gpu.model import StepStatics


class TransferManager:
    def __init__(self, statics: StepStatics, device, max_rows: int, heads: int, head_dim: int):
        self.statics = statics
        self.device = device
        self.heads = heads
        self.head_dim = head_dim
        self.copy_stream = torch.cuda.Stream(device)
        self.uploaded = torch.cuda.Event()
        self.o_far_pinned = torch.zeros((max_rows, heads, head_dim), dtype=torch.float32, pin_memory=True)
        self.lse_far_pinned = torch.zeros((max_rows, heads), dtype=torch.float32, pin_memory=True)

    def upload_partials(self, rows: torch.Tensor, o_host: torch.Tensor, lse_host: torch.Tensor, bs: int) -> None:
        n = o_host.shape[0]
        if n > self.o_far_pinned.shape[0]:
            self.o_far_pinned = torch.empty((n, self.heads, self.head_dim), dtype=torch.float32, pin_memory=True)  # ok: FC107
            self.lse_far_pinned = torch.empty((n, self.heads), dtype=torch.float32, pin_memory=True)
        if bs > self.statics.o_far.shape[0]:
            self.statics.o_far = torch.empty((bs, self.heads, self.head_dim), dtype=torch.float32, device=self.device)  # expect: FC107
        self.o_far_pinned[:n].copy_(o_host)
        self.lse_far_pinned[:n].copy_(lse_host)
        with torch.cuda.stream(self.copy_stream):
            self.statics.lse_far[:bs].fill_(float("-inf"))
            o_dev = self.o_far_pinned[:n].to(self.device, non_blocking=True)
            lse_dev = self.lse_far_pinned[:n].to(self.device, non_blocking=True)
            self.statics.o_far.index_copy_(0, rows, o_dev)
            self.statics.lse_far.index_copy_(0, rows, lse_dev)
            self.uploaded.record(self.copy_stream)
        self._check_statics()
        self.copy_stream.synchronize()  # expect: FC101

    def _check_statics(self) -> None:
        assert self.statics.o_far.shape[0] == self.statics.lse_far.shape[0]  # ok: FC109

    def clear(self, bs: int) -> None:
        self.statics.lse_far[:bs].fill_(float("-inf"))
