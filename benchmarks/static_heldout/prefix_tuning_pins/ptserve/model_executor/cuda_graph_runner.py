from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Dict, List

import torch

from ptserve.model_executor.forward_batch import ForwardBatch, ForwardMode

if TYPE_CHECKING:
    from ptserve.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        args = model_runner.server_args
        self.device = model_runner.device
        self.capture_bs: List[int] = [1, 2, 4, 8] + list(range(16, args.cuda_graph_max_bs + 1, 16))
        self.max_bs = self.capture_bs[-1]
        self.log_every = args.log_replay_every
        self.replay_count = 0
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.output_logits: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.prefix_lens = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)
        self.tenant_ids = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)
        self.tenant_pad = torch.zeros(self.max_bs, dtype=torch.int32, device=self.device)
        self.tenant_ids_cpu = torch.zeros(self.max_bs, dtype=torch.int32)
        self.tenant_pad_cpu = torch.zeros(self.max_bs, dtype=torch.int32)
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs)
        self.capture()

    def can_run(self, fb: ForwardBatch) -> bool:
        return fb.forward_mode.is_decode() and fb.batch_size <= self.max_bs

    def bs_for(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            self.capture_one_batch_size(bs)
            torch.cuda.synchronize()  # ok: FC101
        logger.info("captured %d decode graphs", len(self.graphs))

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            prefix_lens=self.prefix_lens[:bs],
            tenant_ids=self.tenant_ids[:bs],
            tenant_ids_cpu=self.tenant_ids_cpu[:bs],
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            kv_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            attn_backend=self.model_runner.attn_backend,
            # before the first tenant registers, every row uses the default soft prompt
            all_shared_prompt=self.model_runner.registry.num_tenants == 0,
        )

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        backend = self.model_runner.attn_backend
        backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        model = self.model_runner.model

        def run_once() -> torch.Tensor:
            return model.forward_decode(self.input_ids[:bs], self.positions[:bs], fb)

        for _ in range(2):
            run_once()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.output_logits[bs] = out

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        raw_bs = fb.batch_size
        bs = self.bs_for(raw_bs)
        self.input_ids[:raw_bs].copy_(fb.input_ids)
        self.positions[:raw_bs].copy_(fb.positions)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.prefix_lens[:raw_bs].copy_(fb.prefix_lens)
        self.tenant_ids = torch.cat([fb.tenant_ids, self.tenant_pad[: bs - raw_bs]])  # expect: FC107
        self.tenant_ids_cpu = torch.cat([fb.tenant_ids_cpu, self.tenant_pad_cpu[: bs - raw_bs]])  # ok: FC107
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        self.replay_count += 1
        if self.replay_count % self.log_every == 0:
            logger.info(f"decode graph replay #{self.replay_count}: bs={bs} soft-prompt lens {fb.prefix_lens}")  # expect: FC101
        self.graphs[bs].replay()
        return self.output_logits[bs][:raw_bs]
