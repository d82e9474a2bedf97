"""Branch bookkeeping: conversations fork into tool-call branches and join back."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

import numpy as np
import torch

from agentkv.config import BRANCH_FREE, BRANCH_JOINED, BRANCH_RUNNING, BRANCH_WAITING_TOOL, AgentServeConfig


@dataclass
class Branch:
    branch_id: int
    conv_id: int
    slot: int
    pages: np.ndarray
    length: int
    shared_len: int
    tool_name: str = ""
    pending: List[int] = field(default_factory=list)
    output_ids: List[int] = field(default_factory=list)
    parent: Optional[int] = None

    @property
    def own_len(self) -> int:
        return self.length - self.shared_len


@dataclass
class Conversation:
    conv_id: int
    prefix_pages: np.ndarray
    prefix_len: int
    branch_ids: List[int] = field(default_factory=list)
    pending_joins: int = 0
    joined_outputs: Dict[str, List[int]] = field(default_factory=dict)


class BranchTable:
    """Host records of every branch, plus the per-slot device state the kernels read."""

    def __init__(self, cfg: AgentServeConfig, device):
        self.cfg = cfg
        self.device = device
        self.branches: Dict[int, Branch] = {}
        self.convs: Dict[int, Conversation] = {}
        self.live: Set[int] = set()
        self._next_branch = 0
        self._free_slots = list(range(cfg.max_branches - 1, -1, -1))
        self.branch_lens = torch.zeros(cfg.max_branches, dtype=torch.int32, device=device)
        self.branch_state = torch.zeros(cfg.max_branches, dtype=torch.int8, device=device)
        self.branch_lens_cpu = torch.zeros(cfg.max_branches, dtype=torch.int32, pin_memory=True)

    @property
    def longest_branch(self) -> int:
        return int(self.branch_lens.max())  # expect: FC101

    @property
    def longest_branch_host(self) -> int:
        return int(self.branch_lens_cpu.max())  # ok: FC101

    def add_conversation(self, conv_id: int, prefix_pages: np.ndarray, prefix_len: int) -> Conversation:
        conv = Conversation(conv_id, prefix_pages, prefix_len)
        self.convs[conv_id] = conv
        return conv

    def spawn(self, conv: Conversation, page_lists: List[np.ndarray], tool_names: List[str]) -> List[Branch]:
        spawned = []
        for pages, name in zip(page_lists, tool_names):
            slot = self._free_slots.pop()
            br = Branch(
                branch_id=self._next_branch,
                conv_id=conv.conv_id,
                slot=slot,
                pages=pages,
                length=conv.prefix_len,
                shared_len=conv.prefix_len,
                tool_name=name,
            )
            self._next_branch += 1
            self.branches[br.branch_id] = br
            self.live.add(br.branch_id)
            conv.branch_ids.append(br.branch_id)
            self.branch_lens_cpu[slot] = br.length
            spawned.append(br)
        conv.pending_joins += len(spawned)
        self._publish([br.slot for br in spawned], BRANCH_RUNNING)
        return spawned

    def park(self, br: Branch) -> None:
        """The branch emitted a tool call: it waits for the tool's result."""
        self._publish([br.slot], BRANCH_WAITING_TOOL)

    def resume(self, br: Branch, tool_result_ids: List[int]) -> None:
        br.pending = list(tool_result_ids)
        self._publish([br.slot], BRANCH_RUNNING)

    def advance(self, rows: List[Branch]) -> None:
        for br in rows:
            br.length += len(br.pending)
            br.pending = []
            self.branch_lens_cpu[br.slot] = br.length
        slots = torch.tensor([br.slot for br in rows], dtype=torch.int64)
        self.branch_lens.index_copy_(
            0, slots.to(self.device, non_blocking=True), self.branch_lens_cpu[slots].to(self.device, non_blocking=True)
        )

    def join(self, branch_id: int, result_ids: List[int]) -> Branch:
        assert branch_id in self.live, "join of a branch that is not live"  # expect: FC109
        br = self.branches[branch_id]
        self.live.discard(branch_id)
        conv = self.convs[br.conv_id]
        conv.joined_outputs[br.tool_name] = list(result_ids)
        self._publish([br.slot], BRANCH_JOINED)
        self.branch_lens_cpu[br.slot] = 0
        self._free_slots.append(br.slot)
        return br

    def retire_slot(self, slot: int) -> None:
        self._publish([slot], BRANCH_FREE)

    def _publish(self, slots: List[int], state: int) -> None:
        idx = torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True)
        self.branch_state.index_fill_(0, idx, state)
