"""The engine: telemetry and the watchdog are wired into every step through the hooks."""

import logging

import flashcheck
import torch

from td_engine.backend import TelemetryAttnBackend
from td_engine.batch import StepBatch, make_step_batch
from td_engine.config import EngineConfig
from td_engine.graphs import GraphRunner
from td_engine.hooks import EngineHooks
from td_engine.model import TDModel
from telemetry import NvmlShim, StepTimer, TelemetrySampler, Watchdog

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, cfg: EngineConfig, kv_cache: torch.Tensor, device: str = "cuda"):
        dev = torch.device(device)
        self.cfg = cfg
        self.device = dev
        self.kv_cache = kv_cache
        self.nvml = NvmlShim()
        self.backend = TelemetryAttnBackend(cfg, dev, self.nvml)
        self.model = TDModel(cfg, self.backend).to(dev)
        self.runner = GraphRunner(cfg, self.model, self.backend, kv_cache)
        self.timer = StepTimer(blocking=cfg.blocking_timing)
        self.watchdog = Watchdog(cfg.watchdog_timeout_s, on_hang=self._on_hang)
        self.sampler = TelemetrySampler(self.nvml, self.timer, dev.index or 0)
        self.hooks = EngineHooks(self.timer, self.watchdog, cfg.log_every)
        self.max_graph_bs = max(cfg.buckets)
        self.step_ms_host = torch.zeros(cfg.timing_window)
        self.step_id = 0
        self.tokens_seen = 0

    def start(self) -> None:
        self.runner.capture_all()
        self.watchdog.start()
        self.sampler.start()

    def make_batch(self, token_lists, seq_lens, page_tables, is_prefill: bool) -> StepBatch:
        return make_step_batch(token_lists, seq_lens, page_tables, self.cfg.page_size, self.device, is_prefill)

    def _on_hang(self, step_id: int) -> None:
        logger.error("watchdog: step %d made no progress for %.0fs", step_id, self.cfg.watchdog_timeout_s)

    def _recover(self) -> None:
        """The watchdog fired: the hung step was abandoned; reset graph inputs and metadata."""
        self.backend.reset_graph_metadata()
        self.runner.static_positions = torch.zeros_like(self.runner.static_positions)  # expect: FC107
        self.watchdog.aborted.clear()

    @flashcheck.hot_path
    def step(self, batch: StepBatch) -> torch.Tensor:
        if self.watchdog.aborted.is_set():
            self._recover()
        self.hooks.before_step(self.step_id, batch)
        n_tok = int(batch.seq_lens_cpu.sum())  # ok: FC101
        if batch.is_prefill:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_prefill(batch.tokens, batch.positions, self.kv_cache)
        elif batch.batch_size <= self.max_graph_bs:
            logits = self.runner.replay(batch)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_decode(batch.tokens, batch.positions, self.kv_cache, batch.batch_size)
        self.hooks.after_step(self.step_id, batch)
        window = self.cfg.timing_window
        if self.step_id % window == 0:
            self.step_ms_host = torch.zeros(window)  # ok: FC107
        self.step_ms_host[self.step_id % window] = self.timer.last_ms
        self.tokens_seen += n_tok
        self.step_id += 1
        return logits

    def telemetry_snapshot(self) -> dict:
        return {
            "kv_layout": self.backend._kv_layout,  # ok: FC103
            "workspace_bytes": self.sampler.workspace_bytes(self.backend.all_wrappers()),
            "last": self.sampler.samples[-1] if self.sampler.samples else None,
            "tokens_seen": self.tokens_seen,
        }
