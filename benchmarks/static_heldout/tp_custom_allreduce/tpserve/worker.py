"""One TP worker process: rank 0 schedules and broadcasts each step, every rank runs its shard."""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist

from tpserve.attention import ModelConfig, RankAttention, StepBatch
from tpserve.comm.custom_allreduce import get_tp_group, init_custom_allreduce, init_tp_group
from tpserve.graph_runner import CudaGraphRunner
from tpserve.model import TPModel


class TPWorker:
    def __init__(self, cfg: ModelConfig, tp_rank: int, tp_size: int, num_pages: int, init_method: str) -> None:
        dist.init_process_group("nccl", init_method=init_method, rank=tp_rank, world_size=tp_size)
        torch.cuda.set_device(tp_rank)
        self.cfg = cfg
        self.tp_rank = tp_rank
        self.device = torch.device("cuda", tp_rank)
        init_tp_group(list(range(tp_size)))
        self.cpu_group = dist.new_group(list(range(tp_size)), backend="gloo")
        self.ca = init_custom_allreduce(self.device, disable=tp_size == 1)
        self.attn = RankAttention(cfg, tp_rank, tp_size, self.device)
        self.model = TPModel(cfg, self.attn, tp_size).to(self.device, dtype=torch.bfloat16)
        layout = self.attn._kv_layout  # ok: FC103
        page_shape = (cfg.page_size, self.attn.num_kv_heads, cfg.head_dim)
        if layout == "HND":
            page_shape = (self.attn.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_caches = [
            torch.zeros((num_pages, 2) + page_shape, dtype=torch.bfloat16, device=self.device)
            for _ in range(cfg.num_layers)
        ]
        self.graph_runner = CudaGraphRunner(self.model, self.attn, self.ca, cfg, self.device)

    def warmup(self) -> None:
        self.graph_runner.capture(self.kv_caches)

    # ------------------------------------------------------------------ broadcast of the step
    def _send_batch(self, batch: StepBatch) -> None:
        nnz = int(sum(-(-n // self.cfg.page_size) for n in batch.seq_lens_cpu.tolist()))
        meta = torch.tensor([batch.batch_size, nnz, batch.page_table_np.shape[1]], dtype=torch.int64)
        dist.broadcast(meta, src=0, group=self.cpu_group)
        dist.broadcast(batch.seq_lens_cpu, src=0, group=self.cpu_group)
        dist.broadcast(torch.from_numpy(batch.page_table_np), src=0, group=self.cpu_group)
        dist.broadcast(batch.input_ids, src=0, group=get_tp_group())
        dist.broadcast(batch.positions, src=0, group=get_tp_group())

    def _recv_batch(self) -> StepBatch:
        meta = torch.empty(3, dtype=torch.int64)
        dist.broadcast(meta, src=0, group=self.cpu_group)
        bs, nnz, width = meta.tolist()
        seq_lens_cpu = torch.empty(bs, dtype=torch.int32)
        page_table = torch.empty(bs, width, dtype=torch.int32)
        dist.broadcast(seq_lens_cpu, src=0, group=self.cpu_group)
        dist.broadcast(page_table, src=0, group=self.cpu_group)
        input_ids = torch.empty(bs, dtype=torch.int64, device=self.device)
        positions = torch.empty(bs, dtype=torch.int64, device=self.device)
        dist.broadcast(input_ids, src=0, group=get_tp_group())
        dist.broadcast(positions, src=0, group=get_tp_group())
        page_table_np = page_table.numpy()
        if bs <= self.graph_runner.capture_bs[-1]:
            # followers land the page list straight in the graph buffer, so their replay finds it in place
            counts = -(-seq_lens_cpu.numpy() // self.cfg.page_size)
            flat = np.concatenate([page_table_np[i, :n] for i, n in enumerate(counts)])
            self.attn.cuda_graph_kv_indices[:nnz].copy_(torch.from_numpy(flat), non_blocking=True)  # expect: FC104
        ps = self.cfg.page_size
        loc = page_table_np[np.arange(bs), (seq_lens_cpu.numpy() - 1) // ps].astype(np.int64) * ps
        loc += (seq_lens_cpu.numpy() - 1) % ps
        return StepBatch(
            batch_size=bs,
            input_ids=input_ids,
            positions=positions,
            out_cache_loc=torch.from_numpy(loc).to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            page_table_np=page_table_np,
        )

    # ------------------------------------------------------------------ the worker step
    def execute_model(self, batch: Optional[StepBatch]) -> List[int]:
        if self.tp_rank == 0:
            self._send_batch(batch)
        else:
            batch = self._recv_batch()
        if batch.batch_size <= self.graph_runner.capture_bs[-1]:
            logits = self.graph_runner.replay(batch)
        else:
            self.attn.init_forward_metadata(batch)
            logits = self.model(batch.input_ids, batch.positions, batch.out_cache_loc, self.kv_caches)
        # vocab-parallel logits: gather the shards, then rank 0 samples
        shards = [torch.empty_like(logits) for _ in range(dist.get_world_size())]
        dist.all_gather(shards, logits, group=get_tp_group())
        next_ids = torch.argmax(torch.cat(shards, dim=-1), dim=-1)
        return next_ids.tolist() if self.tp_rank == 0 else []
