"""Rank 0 broadcasts each step's page tables; every rank all-gathers its memory headroom."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
import torch.distributed as dist

from tpdist.config import TPConfig
from tpdist.schedule import StepPlan

HEADER_LEN = 4


@dataclass
class StepMeta:
    batch_size: int
    num_pages: int
    num_tokens: int
    is_prefill: bool
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    last_page_host: torch.Tensor
    kv_indptr: torch.Tensor  # device copy for the KV-append kernel
    last_page_len: torch.Tensor  # device copy for the KV-append kernel
    kv_indices: torch.Tensor
    seq_lens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor


class MetadataBroadcaster:
    def __init__(self, cfg: TPConfig, group: dist.ProcessGroup, cpu_group: dist.ProcessGroup,
                 world_size: int, device: torch.device, landing: torch.Tensor):
        assert world_size > 1, "metadata broadcast needs more than one rank"  # expect: FC109
        self.cfg = cfg
        self.rank = cfg.rank
        self.group = group
        self.cpu_group = cpu_group
        self.device = device
        cap = cfg.max_batch + 1
        self.header_host = torch.zeros(HEADER_LEN, dtype=torch.int64, pin_memory=True)
        # qo_indptr | kv_indptr | last_page (host, over gloo)
        self.meta_host = torch.zeros(3 * cap, dtype=torch.int32, pin_memory=True)
        # ids | positions (device, over NCCL)
        self.tokens_dev = torch.zeros(2, cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.kv_indptr_dev = torch.zeros(cap, dtype=torch.int32, device=device)
        self.last_page_dev = torch.ones(cap, dtype=torch.int32, device=device)
        self.seq_lens_dev = torch.zeros(cfg.max_batch, dtype=torch.int32, device=device)
        # the page indices are the large part: land them where the decode kernels read them
        self.landing = landing
        self.headroom_local = torch.zeros(1, dtype=torch.int64, device=device)
        self.headroom_all = torch.zeros(world_size, dtype=torch.int64, device=device)
        self.last_headroom: List[int] = [0] * world_size
        self.comm_stream = torch.cuda.Stream(device=device)

    def _check_header(self) -> None:
        assert self.header_host.numel() == HEADER_LEN  # ok: FC109

    def _pack_host(self, plan: StepPlan, rows: int) -> None:
        cap = rows + 1
        self.meta_host[0:cap].copy_(plan.qo_indptr_cpu)
        self.meta_host[cap : 2 * cap].copy_(plan.kv_indptr_cpu)
        self.meta_host[2 * cap : 3 * cap - 1].copy_(plan.last_page_cpu)

    def broadcast_step(self, plan: Optional[StepPlan], headroom: int) -> StepMeta:
        self._check_header()
        self.headroom_local.fill_(headroom)
        self.comm_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.comm_stream):
            dist.all_gather_into_tensor(self.headroom_all, self.headroom_local, group=self.group)
        if self.rank == 0:
            self.header_host.copy_(plan.header_cpu)
        dist.broadcast(self.header_host, src=0, group=self.cpu_group)
        rows, pages, tokens, is_prefill = self.header_host.tolist()  # ok: FC101
        cap = rows + 1
        if self.rank == 0:
            self._pack_host(plan, rows)
            self.landing[:pages].copy_(plan.kv_indices_cpu[:pages], non_blocking=True)  # expect: FC104
            self.tokens_dev[0, :tokens].copy_(plan.input_ids_cpu, non_blocking=True)  # ok: FC104
            self.tokens_dev[1, :tokens].copy_(plan.positions_cpu, non_blocking=True)
            self.kv_indptr_dev[:cap].copy_(plan.kv_indptr_cpu, non_blocking=True)
            self.last_page_dev[:rows].copy_(plan.last_page_cpu, non_blocking=True)
            self.seq_lens_dev[:rows].copy_(torch.from_numpy(plan.seq_lens_np), non_blocking=True)
        dist.broadcast(self.meta_host[: 3 * cap], src=0, group=self.cpu_group)
        self.comm_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.comm_stream):
            dist.broadcast(self.landing[:pages], src=0, group=self.group)
            dist.broadcast(self.tokens_dev[:, :tokens], src=0, group=self.group)
            dist.broadcast(self.kv_indptr_dev[:cap], src=0, group=self.group)
            dist.broadcast(self.last_page_dev[:rows], src=0, group=self.group)
            dist.broadcast(self.seq_lens_dev[:rows], src=0, group=self.group)
        if self.rank == 0:
            self.last_headroom = self.headroom_all.tolist()  # expect: FC101
        if self.cfg.blocking_comm:
            self.comm_stream.synchronize()  # expect: FC101
        else:
            torch.cuda.current_stream().wait_stream(self.comm_stream)  # ok: FC101
        meta = StepMeta(
            batch_size=rows,
            num_pages=pages,
            num_tokens=tokens,
            is_prefill=bool(is_prefill),
            qo_indptr_host=self.meta_host[0:cap],
            kv_indptr_host=self.meta_host[cap : 2 * cap],
            last_page_host=self.meta_host[2 * cap : 3 * cap - 1],
            kv_indptr=self.kv_indptr_dev[:cap],
            last_page_len=self.last_page_dev[:rows],
            kv_indices=self.landing[:pages],
            seq_lens=self.seq_lens_dev[:rows],
            input_ids=self.tokens_dev[0, :tokens],
            positions=self.tokens_dev[1, :tokens],
        )
        # the next broadcast overwrites seq_lens_dev while this step's kernels may still read it
        meta.seq_lens = self.seq_lens_dev[:rows].clone()  # ok: FC107
        return meta
