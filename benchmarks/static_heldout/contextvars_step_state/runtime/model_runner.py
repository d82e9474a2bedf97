"""Model runner: sets the step context, then replays a graph or runs the eager forward."""
from typing import List, Sequence

import torch

from backends.flashinfer_backend import FlashInferAttnBackend
from ctxserve.config import ServeConfig
from ctxserve.context import CURRENT_META, host_staging, step_context
from ctxserve.metadata import ForwardBatch
from layers.attention import DecoderModel
from runtime.graph_runner import CudaGraphRunner

class PlanStats:
    """How each step was run; exported on /metrics."""
    def __init__(self):
        self._plan_info = {"graph": 0, "eager": 0, "extend": 0}  # ok: FC103
    def record(self, kind: str):
        self._plan_info[kind] += 1  # ok: FC103

class ModelRunner:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device = cfg, device
        self.attn_backend = FlashInferAttnBackend(cfg, device)
        self.model = DecoderModel(cfg, self.attn_backend).to(device)
        shape = (cfg.num_pages // cfg.num_layers, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.graph_runner = CudaGraphRunner(cfg, self.model, self.attn_backend, device)
        self.stats = PlanStats()
        host_staging()["seq_lens"] = torch.zeros(cfg.max_running_requests, dtype=torch.int32, pin_memory=True)
    def warmup(self):
        """Loads the JIT kernels with a one-row plan, then captures every bucket."""
        c = self.cfg
        one = torch.tensor([0, 1], dtype=torch.int32)
        self.attn_backend.decode_wrapper.plan(one, one[:1].to(self.device), one[1:], c.num_qo_heads, c.num_kv_heads,  # ok: FC102
                                              c.head_dim, c.page_size)
        self.graph_runner.capture(self.kv_caches)
    def build_batch(self, is_decode: bool, input_ids: List[int], positions: List[int], seq_lens: Sequence[int],
                    prefix_lens: Sequence[int], page_rows: Sequence[Sequence[int]], slots: Sequence[int]) -> ForwardBatch:
        assert len(seq_lens) == len(page_rows) == len(slots), "scheduler handed a ragged batch"  # expect: FC109
        page, i32 = self.cfg.page_size, torch.int32
        lens = torch.tensor(seq_lens, dtype=i32)
        npages = (lens + page - 1) // page
        indptr = torch.cat([torch.zeros(1, dtype=i32), torch.cumsum(npages, 0, dtype=i32)])
        last = lens - (npages - 1) * page
        prefix = torch.tensor(prefix_lens, dtype=i32)
        qo = torch.cat([torch.zeros(1, dtype=i32), torch.cumsum(lens - prefix, 0, dtype=i32)])
        table = torch.tensor([p for row, n in zip(page_rows, npages.tolist()) for p in row[:n]], dtype=i32)

        def dev(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(self.device, non_blocking=True)

        return ForwardBatch(is_decode, len(seq_lens), dev(torch.tensor(input_ids)), dev(torch.tensor(positions)), dev(lens),
                            lens, dev(torch.tensor(slots)), dev(indptr), indptr.pin_memory(), dev(table), dev(last),
                            last.pin_memory(), dev(qo), qo.pin_memory(), dev(prefix))
    def forward_decode(self, batch: ForwardBatch) -> List[int]:
        with step_context(batch):
            if batch.batch_size <= self.graph_runner.buckets[-1]:
                self.stats.record("graph")
                tokens = self.graph_runner.replay()
            else:
                self.stats.record("eager")
                token = self.attn_backend.init_forward_metadata()
                try:
                    hidden = self.model.forward_decode(batch.input_ids, batch.positions, self.kv_caches)
                    tokens = self.graph_runner.sampler.sample(self.model.compute_logits(hidden))
                finally:
                    CURRENT_META.reset(token)
        # the token just written lengthens every row's last page
        self.attn_backend.kv_last_page_len[: batch.batch_size] += 1  # expect: FC104
        self.attn_backend.kv_last_page_len_cpu[: batch.batch_size] += 1  # ok: FC104
        return tokens
    def forward_extend(self, batch: ForwardBatch) -> List[int]:
        with step_context(batch):
            self.stats.record("extend")
            token = self.attn_backend.init_forward_metadata()
            try:
                hidden = self.model.forward_extend(batch.input_ids, batch.positions, self.kv_caches)
                last = batch.qo_indptr[1:] - 1
                return self.graph_runner.sampler.sample(self.model.compute_logits(hidden[last]))
            finally:
                CURRENT_META.reset(token)
    def abort_all(self):
        self.attn_backend.trtllm.reset_pages()
    def resize_sampler(self, max_running: int):
        """Admin endpoint: the sampler's per-request state follows a new max_running_requests."""
        self.graph_runner.sampler.temperatures = torch.zeros(max_running, device=self.device)  # ok: FC107
