from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from tok_srt.forward_batch import ForwardBatch, ForwardMode
from tokpool.memory_pool import BaseTokenToKVPool, ReqToTokenPool
from tokpool.radix_cache import RadixCache, TreeNode


@dataclasses.dataclass
class Req:
    rid: str
    origin_input_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = dataclasses.field(default_factory=list)
    fill_ids: List[int] = dataclasses.field(default_factory=list)
    prefix_indices: Optional[torch.Tensor] = None
    last_node: Optional[TreeNode] = None
    req_pool_idx: Optional[int] = None
    extend_input_len: int = 0
    finished: bool = False

    def init_next_round_input(self, tree_cache: RadixCache) -> None:
        self.fill_ids = self.origin_input_ids + self.output_ids
        # keep the last token out of the match so that the extend has at least one query
        self.prefix_indices, self.last_node = tree_cache.match_prefix(self.fill_ids[:-1])
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)  # ok: FC101


class ScheduleBatch:
    def __init__(
        self,
        reqs: List[Req],
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool: BaseTokenToKVPool,
        tree_cache: RadixCache,
        attn_backend,
        device: torch.device,
    ):
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.tree_cache = tree_cache
        self.attn_backend = attn_backend
        self.device = device
        self.forward_batch: Optional[ForwardBatch] = None

    def batch_size(self) -> int:
        return len(self.reqs)

    def _alloc_token_slots(self, n: int) -> torch.Tensor:
        out = self.token_to_kv_pool.alloc(n)
        if out is None:
            self.tree_cache.evict(n)
            out = self.token_to_kv_pool.alloc(n)
            if out is None:
                raise RuntimeError(f"out of KV slots: need {n}, {self.token_to_kv_pool.available_size()} free")
        return out

    def prepare_for_extend(self) -> ForwardBatch:
        reqs = self.reqs
        bs = len(reqs)
        slots = self.req_to_token_pool.alloc(bs)
        if slots is None:
            raise RuntimeError("no free request slots")
        extend_num_tokens = sum(r.extend_input_len for r in reqs)  # ok: FC101
        out_cache_loc = self._alloc_token_slots(extend_num_tokens)
        seq_lens, prefix_lens, input_ids, positions = [], [], [], []
        pt = 0
        for r, slot in zip(reqs, slots):
            r.req_pool_idx = slot
            pre, seq = len(r.fill_ids) - r.extend_input_len, len(r.fill_ids)
            self.req_to_token_pool.write((slot, slice(0, pre)), r.prefix_indices)
            self.req_to_token_pool.write((slot, slice(pre, seq)), out_cache_loc[pt : pt + seq - pre])
            pt += seq - pre
            seq_lens.append(seq)
            prefix_lens.append(pre)
            input_ids.extend(r.fill_ids[pre:])
            positions.extend(range(pre, seq))
        seq_lens_dev = torch.tensor(seq_lens, dtype=torch.int32).to(self.device, non_blocking=True)
        seq_lens_sum = int(seq_lens_dev.sum())  # expect: FC101
        prefix_cpu = torch.tensor(prefix_lens, dtype=torch.int32)
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.tensor(positions, dtype=torch.int64).to(self.device, non_blocking=True),
            req_pool_indices=torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True),
            seq_lens=seq_lens_dev,
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
            seq_lens_sum=seq_lens_sum,
            out_cache_loc=out_cache_loc,
            attn_backend=self.attn_backend,
            token_to_kv_pool=self.token_to_kv_pool,
            extend_prefix_lens=prefix_cpu.to(self.device, non_blocking=True),
            extend_prefix_lens_cpu=prefix_cpu,
        )

    def prepare_for_decode(self) -> ForwardBatch:
        reqs = self.reqs
        bs = len(reqs)
        out_cache_loc = self._alloc_token_slots(bs)
        seq_lens = [len(r.origin_input_ids) + len(r.output_ids) for r in reqs]
        rows = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True)
        cols = torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64).to(self.device, non_blocking=True)
        self.req_to_token_pool.req_to_token[rows, cols] = out_cache_loc.to(torch.int32)
        seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True),
            positions=cols,
            req_pool_indices=rows,
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=sum(seq_lens),
            out_cache_loc=out_cache_loc,
            attn_backend=self.attn_backend,
            token_to_kv_pool=self.token_to_kv_pool,
        )
