"""Block-wise denoising scheduler.

Requests arrive with their prompt already prefilled into the prefix cache (by a
separate prefill worker).  Their answers are generated one block at a time: the
block starts fully masked, every denoising step runs the model over it and the
remasker unmasks the most confident tokens, and a finished block is committed
to the prefix cache before the next block starts.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Optional, Tuple

import torch

from dllm.attn import BidirBlockAttention
from dllm.config import AttnLimits, DLLMConfig
from dllm.graphs import BlockGraphRunner
from dllm.model import DiffusionLM
from dllm.prefix_cache import PrefixKVCache
from dllm.remask import Remasker


@dataclasses.dataclass
class DenoiseBatch:
    """One block of a group of requests, alive for all its denoising steps."""

    req_ids: List[int]
    tokens: torch.Tensor  # device [n, block_len]
    positions: torch.Tensor  # device [n, block_len]
    commit_loc: torch.Tensor  # device [n * block_len] cache slots reserved for the block
    block_len: int
    mask_counts_cpu: torch.Tensor
    step: int = 0
    num_transfer: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)


@dataclasses.dataclass
class Request:
    req_id: int
    gen_len: int
    block_len: int
    generated: int = 0
    output: List[int] = dataclasses.field(default_factory=list)


class DenoiseScheduler:
    def __init__(self, cfg: DLLMConfig, limits: Optional[AttnLimits] = None, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.cache = PrefixKVCache(cfg, self.device)
        self.attn = BidirBlockAttention(cfg, limits or AttnLimits(), self.cache, self.device)
        self.model = DiffusionLM(cfg, self.attn, self.cache).to(self.device)
        self.remasker = Remasker(
            cfg.mask_id, cfg.steps_per_block, max(cfg.graph_bs), max(cfg.block_lens), self.device
        )
        self.graph_runner = BlockGraphRunner(cfg, self.model, self.attn, self.device)
        self.attn.init_graph_buffers(self.graph_runner.keys)
        self.graph_runner.record()
        self.waiting: Deque[Request] = collections.deque()
        self.requests: Dict[int, Request] = {}
        self.active: Optional[DenoiseBatch] = None
        self.num_transfer_cpu: Optional[torch.Tensor] = None
        self.remaining_transfers = 0
        self.done_blocks: List[Tuple[List[int], torch.Tensor, torch.cuda.Event]] = []

    def submit(self, req_id: int, prompt_pages: List[int], prompt_len: int, gen_len: int,
               block_len: Optional[int] = None) -> None:
        block_len = block_len or self.cfg.block_lens[0]
        assert gen_len % block_len == 0, "gen_len must be a whole number of blocks"  # expect: FC109
        self.cache.adopt(req_id, prompt_pages, prompt_len)
        req = Request(req_id, gen_len, block_len)
        self.requests[req_id] = req
        self.waiting.append(req)

    def _start_block(self) -> Optional[DenoiseBatch]:
        if not self.waiting:
            return None
        block_len = self.waiting[0].block_len
        group: List[Request] = []
        while self.waiting and len(group) < max(self.cfg.graph_bs) and self.waiting[0].block_len == block_len:
            group.append(self.waiting.popleft())
        ids = [r.req_id for r in group]
        locs, pos = [], []
        for r in ids:
            start = self.cache.length[r]
            locs.extend(self.cache.reserve_block(r, block_len))
            pos.append(list(range(start, start + block_len)))
        n = len(ids)
        return DenoiseBatch(
            req_ids=ids,
            tokens=torch.full((n, block_len), self.cfg.mask_id, dtype=torch.int64, device=self.device),
            positions=torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            commit_loc=torch.tensor(locs, dtype=torch.int64).to(self.device, non_blocking=True),
            block_len=block_len,
            mask_counts_cpu=torch.full((n,), block_len, dtype=torch.int64),
        )

    def _check_block(self) -> None:
        assert self.active is None or self.active.step <= self.cfg.steps_per_block  # ok: FC109

    def denoise_step(self) -> None:
        self._check_block()
        if self.active is None:
            self.active = self._start_block()
            if self.active is None:
                return
        batch = self.active
        n, block_len = batch.batch_size, batch.block_len
        if batch.step == 0:
            self.num_transfer_cpu = self.remasker.schedule(batch.mask_counts_cpu)  # ok: FC107
            batch.num_transfer = self.num_transfer_cpu.to(self.device, non_blocking=True)
        self.remaining_transfers = int(self.num_transfer_cpu[:, batch.step :].sum())  # ok: FC101

        key = self.graph_runner.key_for(n, block_len)
        if key is not None:
            logits = self.graph_runner.replay(batch.req_ids, batch.tokens, batch.positions, key)
        else:
            self.attn.plan_denoise_step(batch.req_ids, block_len)
            logits = self.model(batch.tokens.view(-1), batch.positions.view(-1))
        x = self.remasker.remask(batch.tokens, logits.view(n, block_len, -1), batch.num_transfer, batch.step)
        batch.tokens = x
        batch.step += 1
        if batch.step == self.cfg.steps_per_block or not (batch.tokens == self.cfg.mask_id).any():  # expect: FC101
            self._commit_block(batch)
            self.active = None

    def _commit_block(self, batch: DenoiseBatch) -> None:
        n, block_len = batch.batch_size, batch.block_len
        # one more eager pass writes the final tokens' K/V into the reserved prefix slots
        self.attn.plan_denoise_step(batch.req_ids, block_len)
        self.model(batch.tokens.view(-1), batch.positions.view(-1), None, batch.commit_loc)
        bufs = self.attn.graph_bufs
        for r in batch.req_ids:
            self.cache.commit(r, block_len)
            first, pages = self.cache.block_pages(r, block_len)
            new_pages = torch.tensor(pages, dtype=torch.int32).to(self.device, non_blocking=True)
            # keep the bound page table in step with the cache for the next block's first replay
            bufs["kv_indices"][first : first + len(pages)] = new_pages  # expect: FC104
        out_host = torch.empty((n, block_len), dtype=torch.int64, pin_memory=True)
        out_host.copy_(batch.tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.done_blocks.append((batch.req_ids, out_host, done))
        for r in batch.req_ids:
            req = self.requests[r]
            req.generated += block_len
            if req.generated < req.gen_len:
                self.waiting.append(req)

    def collect(self) -> Dict[int, List[int]]:
        """Called by the front end between steps: hand out the finished answers."""
        for ids, out_host, done in self.done_blocks:
            done.synchronize()
            for r, row in zip(ids, out_host.tolist()):
                self.requests[r].output.extend(row)
        self.done_blocks.clear()
        finished = {r: req.output for r, req in self.requests.items() if req.generated >= req.gen_len}
        for r in finished:
            self.cache.release(r)
            del self.requests[r]
        return finished
