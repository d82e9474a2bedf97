"""Runs one scheduled step: builds the forward batch, runs the model (eager or graph), samples."""

import logging
from typing import List, Optional

import numpy as np
import torch

from protoserve.config import EngineConfig
from protoserve.flashinfer_backend import FlashInferBackend, PagedKVPool
from protoserve.forward_batch import ForwardBatch, ModelRunnerOutput, SamplingBatchInfo, SchedulerOutput
from protoserve.graph_runner import CudaGraphRunner
from protoserve.model import LlamaForCausalLM
from protoserve.sampling.sampler import Sampler

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device(f"cuda:{cfg.gpu_id}")
        torch.cuda.set_device(self.device)

        self.page_table = np.zeros((cfg.max_num_reqs, cfg.max_pages_per_req), dtype=np.int32)
        self.kv_pool = PagedKVPool(cfg, self.device)
        self.attn_backend = FlashInferBackend(cfg, self.kv_pool, self.page_table, self.device)
        self.model = LlamaForCausalLM(cfg, self.attn_backend).to(device=self.device, dtype=cfg.dtype)
        self.sampler = Sampler(cfg, self.device)
        self.graph_runner: Optional[CudaGraphRunner] = None

        # Sampled tokens stay on the device for the next step (in-flight decodes read them
        # there); two of each so the output processor can still read step N-1 while N runs.
        n, k = cfg.max_num_reqs, cfg.max_top_logprobs
        self.next_token_ids_bufs = [torch.zeros(n, dtype=torch.int64, device=self.device) for _ in range(2)]
        self.logprobs_bufs = [torch.zeros(n, dtype=torch.float32, device=self.device) for _ in range(2)]
        self.topk_ids_bufs = [torch.zeros(n, k, dtype=torch.int64, device=self.device) for _ in range(2)]
        self.topk_logprobs_bufs = [torch.zeros(n, k, device=self.device) for _ in range(2)]
        self._pinned_tokens = [torch.empty(64, dtype=torch.int64, pin_memory=True) for _ in range(2)]
        self.slot_owner: List[Optional[str]] = [None] * cfg.max_num_reqs
        self.step_id = 0

    def init_cuda_graphs(self) -> None:
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()
        logger.info("flashinfer workspaces (bytes): %s", self.attn_backend.workspace_usage())

    def update_page_table(self, slot: int, pages: List[int]) -> None:
        self.page_table[slot, : len(pages)] = pages

    # ------------------------------------------------------------------ per step

    def _upload(self, values, dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)

    def _prepare_forward_batch(self, sched: SchedulerOutput) -> ForwardBatch:
        bs = len(sched.req_ids)
        seq_lens_np = np.asarray(sched.seq_lens, dtype=np.int32)
        prefix_np = np.asarray(sched.prefix_lens, dtype=np.int32)
        extend_np = seq_lens_np - prefix_np
        positions_np = np.concatenate([np.arange(p, s) for p, s in zip(prefix_np, seq_lens_np)])

        input_ids = self._upload(sched.input_ids, torch.int64)
        if sched.has_placeholders:
            # -(row + 1) stands for the token sampled at `row` of the previous step
            prev = self.next_token_ids_bufs[(self.step_id - 1) & 1]
            input_ids = torch.where(input_ids < 0, prev[(-input_ids - 1).clamp(min=0)], input_ids)

        decode = sched.forward_mode.is_decode()
        fb = ForwardBatch(
            forward_mode=sched.forward_mode,
            batch_size=bs,
            input_ids=input_ids,
            positions=torch.from_numpy(positions_np).to(self.device, non_blocking=True),
            req_pool_indices=self._upload(sched.req_pool_indices, torch.int64),
            req_pool_indices_cpu=torch.tensor(sched.req_pool_indices, dtype=torch.int32),
            seq_lens=self._upload(sched.seq_lens, torch.int32),
            seq_lens_cpu=torch.from_numpy(seq_lens_np),
            seq_lens_sum=int(seq_lens_np.sum()),
            out_cache_loc=self._upload(sched.out_cache_loc, torch.int64),
        )
        if not decode:
            fb.extend_seq_lens = self._upload(extend_np, torch.int32)
            fb.extend_seq_lens_cpu = extend_np.tolist()
            fb.extend_prefix_lens = self._upload(prefix_np, torch.int32)
            fb.extend_prefix_lens_cpu = prefix_np.tolist()
            fb.logits_indices = self._upload(np.cumsum(extend_np) - 1, torch.int64)
        fb.sampling = SamplingBatchInfo.build(
            sched.sampling_params, sched.output_lens, sched.req_pool_indices, self.cfg.vocab_size, self.device
        )
        return fb

    def _reconcile_slots(self, sched: SchedulerOutput) -> None:
        # A slot that changed owner since the last step starts with clean penalty state.
        for slot, req_id in zip(sched.req_pool_indices, sched.req_ids):
            if self.slot_owner[slot] != req_id:  # ok: FC101
                self.sampler.penalizer.reset_slot(slot)
                self.slot_owner[slot] = req_id

    @torch.inference_mode()
    def execute_step(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        fb = self._prepare_forward_batch(sched)
        self._reconcile_slots(sched)
        bs = fb.batch_size

        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
        sampled = self.sampler(logits, fb.sampling)

        parity = self.step_id & 1
        next_ids = self.next_token_ids_bufs[parity][:bs].copy_(sampled.next_token_ids)
        logprobs = self.logprobs_bufs[parity][:bs].copy_(sampled.logprobs)

        # Requests that just hit a stop token release their penalty state right away.
        stop_hit = (next_ids[:, None] == fb.sampling.stop_token_ids).any(-1)
        if any(stop_hit):  # expect: FC101
            self.sampler.penalizer.reset_rows(fb.sampling.req_slots, stop_hit)

        topk_ids = topk_logprobs = None
        if sampled.topk_ids is not None:
            topk_ids = self.topk_ids_bufs[parity][:bs].copy_(sampled.topk_ids)
            topk_logprobs = self.topk_logprobs_bufs[parity][:bs].copy_(sampled.topk_logprobs)

        if self._pinned_tokens[parity].shape[0] < bs:
            self._pinned_tokens[parity] = torch.empty(2 * bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        tokens_cpu = self._pinned_tokens[parity][:bs]
        tokens_cpu.copy_(next_ids, non_blocking=True)  # ok: FC101
        copy_done = torch.cuda.Event()
        copy_done.record()
        self.step_id += 1

        return ModelRunnerOutput(
            req_ids=list(sched.req_ids),
            next_token_ids=next_ids,
            next_token_ids_cpu=tokens_cpu,
            copy_done=copy_done,
            next_token_logprobs=logprobs,
            topk_ids=topk_ids,
            topk_logprobs=topk_logprobs,
        )
