"""Per-step metadata of a fork/join batch: a shared-prefix level and a per-branch level."""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import torch

from agentkv.branches import Branch, BranchTable
from agentkv.config import BRANCH_RUNNING, AgentServeConfig
from agentkv.cow_pages import CowPagePool


@dataclass
class SharedPrefixLevel:
    """Level 0 of the cascade: one entry per conversation with branches in the batch."""

    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor


@dataclass
class BranchMetadata:
    batch_size: int
    rows: List[Branch]
    slots: torch.Tensor
    shared: SharedPrefixLevel
    # level 1: each branch's own pages after the shared prefix
    branch_qo_indptr: torch.Tensor
    branch_qo_indptr_cpu: torch.Tensor
    branch_kv_indptr_cpu: torch.Tensor
    branch_kv_indices: torch.Tensor
    # whole page lists (prefix + own), for the graph decode and the trtllm path
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    seq_lens: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor
    cow_rows_np: np.ndarray
    max_seq_len: int
    has_shared_prefix: bool = True
    is_extend: bool = False
    use_trtllm: bool = False
    graph_bs: Optional[int] = None
    stale_slots: Optional[torch.Tensor] = None


def _group_by_conversation(rows: List[Branch]) -> List[Tuple[int, int, int]]:
    groups: List[Tuple[int, int, int]] = []
    for i, br in enumerate(rows):
        if groups and groups[-1][0] == br.conv_id:
            conv_id, first, count = groups[-1]
            groups[-1] = (conv_id, first, count + 1)
        else:
            groups.append((br.conv_id, i, 1))
    return groups


class BranchMetadataBuilder:
    """Builds one step's cascade metadata on the host, numpy into pinned buffers."""

    def __init__(self, cfg: AgentServeConfig, pool: CowPagePool, device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        mb = cfg.max_branches
        pin = dict(dtype=torch.int32, pin_memory=True)
        self.conv_qo_indptr_cpu = torch.zeros(mb + 1, **pin)
        self.conv_kv_indptr_cpu = torch.zeros(mb + 1, **pin)
        self.conv_last_page_len_cpu = torch.zeros(mb, **pin)
        self.branch_qo_indptr_cpu = torch.zeros(mb + 1, **pin)
        self.branch_kv_indptr_cpu = torch.zeros(mb + 1, **pin)
        self.kv_indptr_cpu = torch.zeros(mb + 1, **pin)
        self.last_page_len_cpu = torch.zeros(mb, **pin)
        self.seq_lens_cpu = torch.zeros(mb, **pin)

    def build(self, table: BranchTable, branches: List[Branch]) -> BranchMetadata:
        page = self.cfg.page_size
        rows = sorted(branches, key=lambda b: (b.conv_id, b.slot))
        bs = len(rows)
        q_lens = np.array([len(br.pending) for br in rows], dtype=np.int32)
        groups = _group_by_conversation(rows)

        conv_qo = self.conv_qo_indptr_cpu.numpy()
        conv_kv = self.conv_kv_indptr_cpu.numpy()
        conv_last = self.conv_last_page_len_cpu.numpy()
        conv_qo[0] = 0
        conv_kv[0] = 0
        prefix_lists = []
        for c, (conv_id, first, count) in enumerate(groups):
            conv = table.convs[conv_id]
            n_prefix = conv.prefix_len // page
            prefix_lists.append(conv.prefix_pages[:n_prefix])
            conv_qo[c + 1] = conv_qo[c] + int(q_lens[first : first + count].sum())
            conv_kv[c + 1] = conv_kv[c] + n_prefix
            conv_last[c] = page if n_prefix else 0

        br_qo = self.branch_qo_indptr_cpu.numpy()
        br_kv = self.branch_kv_indptr_cpu.numpy()
        kv = self.kv_indptr_cpu.numpy()
        last = self.last_page_len_cpu.numpy()
        seq = self.seq_lens_cpu.numpy()
        br_qo[0] = br_kv[0] = kv[0] = 0
        own_lists, full_lists, write_pages, write_offsets = [], [], [], []
        for i, br in enumerate(rows):
            new_len = br.length + len(br.pending)
            n_pages = (new_len + page - 1) // page
            own = br.pages[br.shared_len // page : n_pages]
            own_lists.append(own)
            full_lists.append(br.pages[:n_pages])
            br_qo[i + 1] = br_qo[i] + len(br.pending)
            br_kv[i + 1] = br_kv[i] + len(own)
            kv[i + 1] = kv[i] + n_pages
            last[i] = new_len - (n_pages - 1) * page
            seq[i] = new_len
            positions = np.arange(br.length, new_len)
            write_pages.append(br.pages[positions // page])
            write_offsets.append(positions % page)

        last_pages_host = np.array([br.pages[(br.length - 1) // page] for br in rows], dtype=np.int64)
        cow_rows_np = self.pool.find_cow_rows(last_pages_host)

        n_conv = len(groups)
        shared = SharedPrefixLevel(
            qo_indptr_cpu=self.conv_qo_indptr_cpu[: n_conv + 1],
            kv_indptr_cpu=self.conv_kv_indptr_cpu[: n_conv + 1],
            kv_indices=self._upload(np.concatenate(prefix_lists), torch.int32),
            last_page_len_cpu=self.conv_last_page_len_cpu[:n_conv],
        )
        slots = self._upload(np.array([br.slot for br in rows]), torch.int64)
        running = table.branch_state[slots] == BRANCH_RUNNING
        stale = slots[~running]  # expect: FC101
        max_seq_len = table.longest_branch
        return BranchMetadata(
            batch_size=bs,
            rows=rows,
            slots=slots,
            shared=shared,
            branch_qo_indptr=self.branch_qo_indptr_cpu[: bs + 1].to(self.device, non_blocking=True),
            branch_qo_indptr_cpu=self.branch_qo_indptr_cpu[: bs + 1],
            branch_kv_indptr_cpu=self.branch_kv_indptr_cpu[: bs + 1],
            branch_kv_indices=self._upload(np.concatenate(own_lists), torch.int32),
            kv_indptr=self.kv_indptr_cpu[: bs + 1].to(self.device, non_blocking=True),
            kv_indptr_cpu=self.kv_indptr_cpu[: bs + 1],
            kv_indices=self._upload(np.concatenate(full_lists), torch.int32),
            last_page_len_cpu=self.last_page_len_cpu[:bs],
            seq_lens=self.seq_lens_cpu[:bs].to(self.device, non_blocking=True),
            write_pages=self._upload(np.concatenate(write_pages), torch.int64),
            write_offsets=self._upload(np.concatenate(write_offsets), torch.int64),
            cow_rows_np=cow_rows_np,
            max_seq_len=max_seq_len,
            has_shared_prefix=n_conv < bs,
            is_extend=bool(q_lens.max() > 1),
            use_trtllm=max_seq_len > self.cfg.long_context_threshold,
            stale_slots=stale,
        )

    def _upload(self, host: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(host).to(dtype).pin_memory().to(self.device, non_blocking=True)


def dummy_decode_metadata(cfg: AgentServeConfig, bs: int, device) -> BranchMetadata:
    """Capture-time batch: `bs` branches forked from one conversation with a one-page prefix."""
    page = cfg.page_size
    arange = torch.arange(bs + 1, dtype=torch.int32)
    ones = torch.ones(bs, dtype=torch.int32)
    shared = SharedPrefixLevel(
        qo_indptr_cpu=torch.tensor([0, bs], dtype=torch.int32),
        kv_indptr_cpu=torch.tensor([0, 1], dtype=torch.int32),
        kv_indices=torch.zeros(1, dtype=torch.int32, device=device),
        last_page_len_cpu=torch.full((1,), page, dtype=torch.int32),
    )
    return BranchMetadata(
        batch_size=bs,
        rows=[],
        slots=torch.arange(bs, dtype=torch.int64, device=device),
        shared=shared,
        branch_qo_indptr=arange.to(device),
        branch_qo_indptr_cpu=arange,
        branch_kv_indptr_cpu=arange,
        branch_kv_indices=torch.zeros(bs, dtype=torch.int32, device=device),
        kv_indptr=(arange * 2).to(device),
        kv_indptr_cpu=arange * 2,
        kv_indices=torch.zeros(2 * bs, dtype=torch.int32, device=device),
        last_page_len_cpu=ones,
        seq_lens=torch.full((bs,), page + 1, dtype=torch.int32, device=device),
        write_pages=torch.zeros(bs, dtype=torch.int64, device=device),
        write_offsets=torch.zeros(bs, dtype=torch.int64, device=device),
        cow_rows_np=np.zeros(0, dtype=np.int64),
        max_seq_len=page + 1,
        has_shared_prefix=bs > 1,
        graph_bs=bs,
    )
