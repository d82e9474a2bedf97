"""One step of the engine: batch in, sampled token ids out (in a pinned buffer, behind an event)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from dynplugins.window.sliding import SlidingWindowFeature

from ..attention.factory import FEATURES, make_backend
from ..config import EngineConfig
from ..forward_batch import ForwardBatch, ScheduledBatch
from ..kv_pool import PagedKVPool
from ..model import build_model
from .graph_runner import make_graph_runner


@dataclass
class StepOutput:
    host_ids: torch.Tensor
    n: int
    ready: torch.cuda.Event

    def tokens(self) -> List[int]:
        """Called by the scheduler thread when it commits the step's tokens."""
        self.ready.synchronize()  # ok: FC101
        return self.host_ids[: self.n].tolist()


class ModelRunner:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.kv_pool = PagedKVPool(cfg)
        features = [FEATURES[name] for name in cfg.features]
        if cfg.sliding_window:
            features.append(SlidingWindowFeature)
        if cfg.decode_backend == "trtllm-gen":
            features.append(FEATURES["trtllm"])
        group = cfg.num_q_heads // cfg.num_kv_heads
        self.attn_backend = make_backend(
            cfg,
            *features,
            kv_pool=self.kv_pool,
            decode_via_prefill=group >= 8 and cfg.decode_backend != "trtllm-gen",
            num_draft_tokens=cfg.num_draft_tokens,
        )
        self.model = build_model(cfg, self.attn_backend)
        self.eos_id = cfg.eos_token_id
        self.sampled_host: Optional[torch.Tensor] = None
        self.graph_runner = make_graph_runner(self) if "graph" in cfg.features else None

    @torch.inference_mode()
    def step(self, sched: ScheduledBatch) -> StepOutput:
        batch = ForwardBatch.from_schedule(sched, self.device)
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            logits = self.graph_runner.replay(batch)
        else:
            self.attn_backend.init_forward_metadata(batch)
            logits = self.model.forward(batch)
            if not batch.mode.is_decode():
                logits = logits[(batch.qo_indptr[1:] - 1).long()]
        next_ids = self.sample(logits, batch)
        finished = next_ids == self.eos_id
        if finished.any():  # expect: FC101
            self._release_rows(finished)
        return self._copy_out(next_ids, batch.batch_size)

    def sample(self, logits: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        greedy = logits.argmax(-1)
        if batch.temperatures is None:
            return greedy
        temps = batch.temperatures.clamp(min=1e-5).unsqueeze(1)
        sampled = torch.multinomial(torch.softmax(logits.float() / temps, dim=-1), 1).squeeze(1)
        return torch.where(batch.greedy_rows, greedy, sampled)  # ok: FC101

    def _release_rows(self, finished: torch.Tensor) -> None:
        # rows that hit EOS keep a one-token last page until the scheduler retires them next step
        self.attn_backend.kv_last_page_len[: finished.shape[0]].masked_fill_(finished, 1)  # expect: FC104

    def _copy_out(self, next_ids: torch.Tensor, bs: int) -> StepOutput:
        if self.sampled_host is None or self.sampled_host.numel() < bs:
            self.sampled_host = torch.empty(max(bs, 256), dtype=torch.int64, pin_memory=True)  # ok: FC107
        ready = torch.cuda.Event()
        self.sampled_host[:bs].copy_(next_ids, non_blocking=True)
        ready.record()
        return StepOutput(self.sampled_host, bs, ready)
