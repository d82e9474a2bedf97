"""Model runner: one ``step`` per scheduler iteration, dispatched through a (mode, graph) table."""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from kvops.pages import remap_kv_pages
from tabserve.attention.backend import FlashInferTableBackend
from tabserve.batch import ForwardBatch, SamplingInfo, ScheduleOutput
from tabserve.config import EngineConfig, ModelConfig
from tabserve.graph_runner import GraphRunner
from tabserve.model import PagedKVPool, TinyDecoder
from tabserve.modes import Feature, ForwardMode, SamplingFlag
from tabserve.sampler import Sampler

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StepOutput:
    """Token ids land in pinned memory; the output thread waits on ``ready`` before reading them."""

    token_ids: torch.Tensor
    ready: torch.cuda.Event
    eos_pending: bool


def _no_hook(fb: ForwardBatch) -> None:
    return None


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model_cfg: ModelConfig, device: str = "cuda") -> None:
        assert cfg.page_size in (16, 32, 64) or Feature.TRTLLM_DECODE not in cfg.features, "trtllm-gen needs page 16/32/64"  # expect: FC109
        self.cfg = cfg
        self.features = cfg.features
        self.device = torch.device(device)
        self.req_to_page = torch.zeros(
            cfg.max_batch_size, cfg.max_pages_per_req, dtype=torch.int32, device=self.device
        )
        self.kv_pool = PagedKVPool(model_cfg, cfg, self.device)
        self.attn_backend = FlashInferTableBackend(cfg, model_cfg, self.req_to_page, self.device)
        self.model = TinyDecoder(model_cfg, self.attn_backend, self.kv_pool).to(self.device)
        self.sampler = Sampler(cfg)
        self.output_host = torch.zeros(
            cfg.max_batch_size * cfg.num_draft_tokens, dtype=torch.int64, pin_memory=True
        )
        self.copy_done = torch.cuda.Event()
        self._eos_pending = False
        self._last_rows: Optional[torch.Tensor] = None
        self._step_table: Dict[Tuple[ForwardMode, bool], Callable[[ForwardBatch], torch.Tensor]] = {
            (ForwardMode.IDLE, False): self._run_idle,
            (ForwardMode.DECODE, False): self._run_eager,
            (ForwardMode.DECODE, True): self._run_graph,
            (ForwardMode.EXTEND, False): self._run_eager,
            (ForwardMode.MIXED, False): self._run_eager,
            (ForwardMode.TARGET_VERIFY, False): self._run_eager,
            (ForwardMode.TARGET_VERIFY, True): self._run_graph,
        }
        self.graph_runner: Optional[GraphRunner] = GraphRunner(self) if cfg.capture_graphs else None

    def warmup(self) -> None:
        self.attn_backend.warmup_jit()
        if self.graph_runner is not None:
            self.graph_runner.record_all()

    # ------------------------------------------------------------------ batch building

    def _h2d(self, values: Sequence, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)

    def _sampling_info(self, sched: ScheduleOutput, bs: int) -> SamplingInfo:
        temps = sched.temperatures or [0.0] * bs
        top_p = sched.top_p or [1.0] * bs
        all_greedy = all(t == 0.0 for t in temps)
        flags = SamplingFlag.NONE
        if not all_greedy and any(t == 0.0 for t in temps):
            flags |= SamplingFlag.MIXED_GREEDY
        if any(p < 1.0 for p in top_p):
            flags |= SamplingFlag.TOP_P
        return SamplingInfo(self._h2d(temps, torch.float32), self._h2d(top_p, torch.float32), flags, all_greedy)

    def _build_batch(self, sched: ScheduleOutput) -> ForwardBatch:
        mode = sched.forward_mode
        bs = len(sched.req_pool_indices)
        rows_cpu = torch.tensor(sched.req_pool_indices, dtype=torch.int64)
        seq_lens_cpu: Optional[torch.Tensor] = torch.tensor(sched.seq_lens, dtype=torch.int32)
        seq_lens = seq_lens_cpu.pin_memory().to(self.device, non_blocking=True)
        if mode is ForwardMode.TARGET_VERIFY:
            # The drafter appends its tokens on the device; the scheduler's lengths predate them.
            seq_lens = seq_lens + self.cfg.num_draft_tokens
            seq_lens_cpu = None
        use_graph = self.graph_runner is not None and self.graph_runner.can_run(mode, bs)
        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=self._h2d(sched.input_ids, torch.int64),
            positions=self._h2d(sched.positions, torch.int64),
            req_pool_indices=rows_cpu.pin_memory().to(self.device, non_blocking=True),
            req_pool_indices_cpu=rows_cpu,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=self._h2d(sched.out_cache_loc, torch.int64),
            extend_seq_lens=None if sched.extend_seq_lens is None else self._h2d(sched.extend_seq_lens, torch.int32),
            extend_seq_lens_cpu=sched.extend_seq_lens,
            extend_prefix_lens_cpu=sched.extend_prefix_lens,
            custom_mask=None if sched.custom_mask is None else self._h2d(sched.custom_mask, torch.bool),
            sampling=self._sampling_info(sched, bs),
            use_graph=use_graph,
        )

    # ------------------------------------------------------------------ per-mode runs

    def _run_idle(self, fb: ForwardBatch) -> torch.Tensor:
        return torch.empty(0, self.model.vocab_size, device=self.device)

    def _run_eager(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb)

    def _run_graph(self, fb: ForwardBatch) -> torch.Tensor:
        # A decode batch with the same requests as the previous step keeps its plan: the post-step hook has
        # already advanced the page lengths the recorded kernels read.
        rows = fb.req_pool_indices_cpu
        same = fb.forward_mode is ForwardMode.DECODE and self._last_rows is not None and torch.equal(self._last_rows, rows)  # ok: FC101
        self._last_rows = rows
        return self.graph_runner.replay(fb, replan=not same)

    # ------------------------------------------------------------------ the step

    def step(self, sched: ScheduleOutput) -> StepOutput:
        fb = self._build_batch(sched)
        logits = self._step_table[(fb.forward_mode, fb.use_graph)](fb)
        if fb.forward_mode is ForwardMode.TARGET_VERIFY:
            next_ids = torch.argmax(logits, dim=-1)
        else:
            next_ids = self.sampler(logits, fb.sampling)
        self.attn_backend.post_step_hooks.get(fb.forward_mode, _no_hook)(fb)
        if Feature.STOP_ON_EOS in self.features:  # ok: FC101
            if self.cfg.eos_token_id in next_ids:  # expect: FC101
                self._eos_pending = True
        n = next_ids.numel()
        self.output_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        out = StepOutput(self.output_host[:n], self.copy_done, self._eos_pending)
        self._eos_pending = False
        return out

    def defragment(self, old_to_new: torch.Tensor) -> None:
        """Called by the memory manager after it moved pages; the step loop is paused meanwhile."""
        if Feature.PAGE_DEFRAG not in self.features:
            logger.warning("page defragmentation requested but PAGE_DEFRAG is off")
            return
        remap_kv_pages(self.attn_backend, old_to_new)
