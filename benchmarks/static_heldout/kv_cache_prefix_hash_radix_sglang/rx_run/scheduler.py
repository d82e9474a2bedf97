"""Model runner and scheduler: prefix matching on the host, slot allocation on the device."""
from __future__ import annotations

from collections import deque
from typing import Deque, List

import flashcheck
import torch

from radix import ForwardBatch, PagedTokenAllocator, RadixCache, Req, ReqToTokenPool
from rx_attn.flashinfer_backend import BackendDims, FlashInferAttnBackend
from rx_run.cuda_graph_runner import CudaGraphRunner
from rx_run.model import RadixLlama


class ModelRunner:
    def __init__(self, dims: BackendDims, vocab: int, hidden: int, num_layers: int, num_slots: int, device):
        self.device = device
        self.max_context_len = dims.max_context_len
        self.req_to_token_pool = ReqToTokenPool(dims.max_bs * 4, dims.max_context_len, device)
        self.allocator = PagedTokenAllocator(num_slots, 1, device)
        self.attn_backend = FlashInferAttnBackend(dims, self.req_to_token_pool.req_to_token, device)
        self.model = RadixLlama(vocab, hidden, num_layers, dims.num_qo_heads, dims.head_dim, dims.sliding_window).to(device)
        kv_shape = (num_slots, 2, dims.num_kv_heads, dims.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=device) for _ in range(num_layers)]
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode == "decode":
            return self.model.forward_decode(fb.input_ids, self.kv_caches, fb)
        return self.model.forward_extend(fb.input_ids, self.kv_caches, fb)


class Scheduler:
    def __init__(self, runner: ModelRunner, max_running: int):
        self.runner = runner
        self.tree_cache = RadixCache(runner.allocator)
        self.waiting: Deque[Req] = deque()
        self.running: List[Req] = []
        self.max_running = max_running
        self.evict_ts_cpu = torch.zeros(0, dtype=torch.float64)

    def _admit(self, req: Req) -> bool:
        prefix_slots, last_node = self.tree_cache.match_prefix(req.token_ids)
        need = len(req.token_ids) + 1 - prefix_slots.numel()
        slots = self.runner.allocator.alloc(need)
        if slots is None:
            self.evict_ts_cpu = torch.tensor(self.tree_cache.lru_timestamps(), dtype=torch.float64)  # ok: FC107
            self.tree_cache.evict(need)
            slots = self.runner.allocator.alloc(need)
            if slots is None:
                return False
        self.tree_cache.inc_lock_ref(last_node)
        req.last_node = last_node
        req.prefix_len = prefix_slots.numel()
        req.pool_row = self.runner.req_to_token_pool.alloc_row()
        pool = self.runner.req_to_token_pool
        pool.write(req.pool_row, 0, prefix_slots)
        pool.write(req.pool_row, req.prefix_len, slots)
        return True

    def _decode_batch(self) -> ForwardBatch:
        reqs = self.running
        dev = self.runner.device
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        rows_cpu = torch.tensor([r.pool_row for r in reqs], dtype=torch.int32)
        last_cpu = torch.tensor([(r.output_ids or r.token_ids)[-1] for r in reqs], dtype=torch.int64)
        out_loc = self.runner.allocator.alloc(len(reqs))
        return ForwardBatch(
            forward_mode="decode",
            batch_size=len(reqs),
            input_ids=last_cpu.to(dev, non_blocking=True),
            positions=(seq_lens_cpu - 1).long().to(dev, non_blocking=True),
            req_pool_indices=rows_cpu.to(dev, non_blocking=True),
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=out_loc.long(),
            attn_backend=self.runner.attn_backend,
        )

    def fork(self, parent: Req, child: Req, row_offset: int) -> None:
        """Parallel sampling: the child shares the parent's prefix but writes its own last slot."""
        self.tree_cache.inc_lock_ref(parent.last_node)
        child.last_node, child.pool_row = parent.last_node, self.runner.req_to_token_pool.alloc_row()
        new_slot = self.runner.allocator.alloc(1)
        self.cow_last_slot(child, new_slot[0], row_offset)

    def cow_last_slot(self, req: Req, new_slot: torch.Tensor, row_offset: int) -> None:
        """A forked request shared its last slot: point its decode row at the private copy."""
        self.runner.attn_backend.cuda_graph_kv_indices[row_offset + req.seq_len - 1] = new_slot  # expect: FC104

    @flashcheck.hot_path
    def schedule_step(self) -> torch.Tensor:
        while self.waiting and len(self.running) < self.max_running:
            if not self._admit(self.waiting[0]):
                break
            self.running.append(self.waiting.popleft())
        fb = self._decode_batch()
        logits = self.runner.forward(fb)
        return logits.argmax(dim=-1)

    def finish(self, req: Req, slots: torch.Tensor) -> None:
        self.tree_cache.insert(req.token_ids + req.output_ids, slots)
        self.tree_cache.dec_lock_ref(req.last_node)
        self.runner.req_to_token_pool.free_rows.append(req.pool_row)
        self.running.remove(req)
