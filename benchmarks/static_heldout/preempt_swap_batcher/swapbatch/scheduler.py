"""Sequences, the block table manager and the scheduler.

Decode steps and prefill steps alternate (no chunked prefill). When a running sequence cannot get a slot for
its next token, the most recently arrived running sequence is preempted by swapping its blocks out to host
memory; swapped sequences come back, oldest first, when blocks free up. The swap lists are rebuilt every step
and executed by the cache engine before the model runs.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Deque, Dict, List, Optional, Set, Tuple


class SeqStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    SWAPPED = auto()
    FINISHED = auto()


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: List[int]
    max_tokens: int = 256
    temperature: float = 1.0
    output_ids: List[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    arrival: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class SwapPlan:
    blocks_to_swap_out: List[Tuple[int, int]] = field(default_factory=list)  # (gpu block, cpu block)
    blocks_to_swap_in: List[Tuple[int, int]] = field(default_factory=list)  # (cpu block, gpu block)
    blocks_to_copy: List[Tuple[int, int]] = field(default_factory=list)  # (src gpu, dst gpu)


@dataclass
class SchedulerOutputs:
    scheduled: List[Sequence]
    is_prefill: bool
    swap_plan: SwapPlan
    preempted: List[Sequence] = field(default_factory=list)
    swapped_in: Set[int] = field(default_factory=set)


class BlockSpaceManager:
    def __init__(self, block_size: int, num_gpu_blocks: int, num_cpu_blocks: int) -> None:
        self.block_size = block_size
        self.free_gpu: List[int] = list(range(num_gpu_blocks))
        self.free_cpu: List[int] = list(range(num_cpu_blocks))
        self.gpu_tables: Dict[int, List[int]] = {}
        self.cpu_tables: Dict[int, List[int]] = {}

    def _blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        return self._blocks_for(seq.num_tokens + 1) <= len(self.free_gpu)

    def allocate(self, seq: Sequence) -> None:
        n = self._blocks_for(seq.num_tokens + 1)
        self.gpu_tables[seq.seq_id] = [self.free_gpu.pop() for _ in range(n)]

    def can_append_slot(self, seq: Sequence) -> bool:
        table = self.gpu_tables[seq.seq_id]
        return len(table) * self.block_size > seq.num_tokens or len(self.free_gpu) > 0

    def append_slot(self, seq: Sequence) -> None:
        table = self.gpu_tables[seq.seq_id]
        if len(table) * self.block_size <= seq.num_tokens:
            table.append(self.free_gpu.pop())

    def can_swap_in(self, seq: Sequence) -> bool:
        # the swapped blocks plus one for the next token
        return len(self.cpu_tables[seq.seq_id]) + 1 <= len(self.free_gpu)

    def swap_out(self, seq_id: int) -> List[Tuple[int, int]]:
        gpu = self.gpu_tables.pop(seq_id)
        cpu = [self.free_cpu.pop() for _ in gpu]
        self.cpu_tables[seq_id] = cpu
        self.free_gpu.extend(gpu)
        return list(zip(gpu, cpu))

    def swap_in(self, seq_id: int) -> List[Tuple[int, int]]:
        assert seq_id in self.cpu_tables, f"sequence {seq_id} has no swapped blocks"  # expect: FC109
        cpu = self.cpu_tables.pop(seq_id)
        gpu = [self.free_gpu.pop() for _ in cpu]
        self.gpu_tables[seq_id] = gpu
        self.free_cpu.extend(cpu)
        return list(zip(cpu, gpu))

    def free(self, seq_id: int) -> None:
        self.free_gpu.extend(self.gpu_tables.pop(seq_id, []))
        self.free_cpu.extend(self.cpu_tables.pop(seq_id, []))

    def block_table(self, seq_id: int) -> List[int]:
        return self.gpu_tables[seq_id]


class Scheduler:
    def __init__(self, block_manager: BlockSpaceManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: Deque[Sequence] = deque()
        self.running: List[Sequence] = []
        self.swapped: Deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def finish(self, seq: Sequence) -> None:
        seq.status = SeqStatus.FINISHED
        self.block_manager.free(seq.seq_id)
        if seq in self.running:
            self.running.remove(seq)

    def schedule(self) -> SchedulerOutputs:
        plan = SwapPlan()
        preempted: List[Sequence] = []
        queue = deque(sorted(self.running, key=lambda s: s.arrival))
        kept: List[Sequence] = []
        while queue:
            seq = queue.popleft()
            while seq is not None and not self.block_manager.can_append_slot(seq):
                victim = queue.pop() if queue else seq
                plan.blocks_to_swap_out.extend(self.block_manager.swap_out(victim.seq_id))
                victim.status = SeqStatus.SWAPPED
                self.swapped.append(victim)
                preempted.append(victim)
                if victim is seq:
                    seq = None
            if seq is not None:
                self.block_manager.append_slot(seq)
                kept.append(seq)
        self.running = kept

        swapped_in: Set[int] = set()
        if not preempted:
            while (
                self.swapped
                and len(self.running) < self.max_num_seqs
                and self.block_manager.can_swap_in(self.swapped[0])
            ):
                seq = self.swapped.popleft()
                plan.blocks_to_swap_in.extend(self.block_manager.swap_in(seq.seq_id))
                self.block_manager.append_slot(seq)
                seq.status = SeqStatus.RUNNING
                self.running.append(seq)
                swapped_in.add(seq.seq_id)

        prefill: List[Sequence] = []
        if not self.swapped and not preempted:
            budget = self.max_num_batched_tokens
            while self.waiting and len(self.running) + len(prefill) < self.max_num_seqs:
                seq = self.waiting[0]
                if len(seq.prompt_ids) > budget or not self.block_manager.can_allocate(seq):
                    break
                self.waiting.popleft()
                self.block_manager.allocate(seq)
                budget -= len(seq.prompt_ids)
                seq.status = SeqStatus.RUNNING
                prefill.append(seq)
        self._check_invariants()
        if prefill:
            self.running.extend(prefill)
            return SchedulerOutputs(prefill, True, plan, preempted, swapped_in)
        return SchedulerOutputs(list(self.running), False, plan, preempted, swapped_in)

    def _check_invariants(self) -> None:
        assert len(self.running) <= self.max_num_seqs, "more running sequences than max_num_seqs"  # ok: FC109
