"""Engine states. ``GPUModelRunner`` holds one in ``self.state`` and delegates each step to ``on_step``."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from sso.config import BatchKind, EngineMode
from sso.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from sso.model_runner import GPUModelRunner

logger = logging.getLogger(__name__)

# wrapper buffers an eager re-entry inspects to decide whether graph plans are still around
_GRAPH_BUF_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_last_page_len_buf")


class EngineState:
    mode = EngineMode.EAGER

    def __init__(self, runner: "GPUModelRunner") -> None:
        self.runner = runner
        self._entered_at = 0.0

    def on_enter(self) -> None:
        self._entered_at = time.monotonic()

    def on_exit(self) -> None:
        pass

    def on_step(self, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError


class EagerState(EngineState):
    mode = EngineMode.EAGER

    def on_enter(self) -> None:
        super().on_enter()
        for w in self.runner.backend.graph_decode_wrappers.values():
            for name in _GRAPH_BUF_FIELDS:
                if getattr(w, name, None) is None:  # expect: FC103
                    logger.warning("graph wrapper lost %s", name)

    def on_exit(self) -> None:
        # drain eager kernels before the next state plans on the same workspace
        torch.cuda.synchronize()  # expect: FC101

    def on_step(self, batch: ForwardBatch) -> torch.Tensor:
        runner = self.runner
        runner.strategy.plan(batch)
        if batch.kind is BatchKind.DECODE:
            runner.backend.reset_eager_buffers(batch.batch_size)
        bs = batch.batch_size
        # per-step object: a fresh gather index is fine here
        batch.logits_indices = torch.cat([batch.qo_indptr[1 : bs + 1] - 1])  # ok: FC107
        return runner.model(batch.input_ids, batch.positions, batch)


class CapturingState(EngineState):
    mode = EngineMode.CAPTURING

    def on_enter(self) -> None:
        super().on_enter()
        logger.info("capturing %d sizes", len(self.runner.cfg.cuda_graph_sizes))
        self.runner.graph_manager.capture_all()

    def on_exit(self) -> None:
        elapsed = time.monotonic() - self._entered_at
        logger.info("capture took %.1fs", elapsed)

    def on_step(self, batch: ForwardBatch) -> torch.Tensor:
        # a step that arrives while capturing runs eagerly
        return EagerState(self.runner).on_step(batch)


class ReplayState(EngineState):
    mode = EngineMode.REPLAYING

    def on_enter(self) -> None:
        super().on_enter()
        for bs, w in self.runner.backend.graph_decode_wrappers.items():
            if not w.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"decode wrapper for bs={bs} is not in graph mode")
        layout = getattr(self.runner.strategy, "_kv_layout", "NHD")  # ok: FC103
        logger.info("replaying with layout %s", layout)

    def on_step(self, batch: ForwardBatch) -> torch.Tensor:
        gm = self.runner.graph_manager
        self.prepare_replay(batch)
        bs = batch.batch_size
        gm.static_positions = batch.positions.clone()  # expect: FC107
        entry = gm.graphs[bs]
        if entry.output.shape[0] < batch.num_tokens:
            entry.output = torch.empty(  # expect: FC107
                batch.num_tokens, self.runner.cfg.hidden_size, dtype=torch.bfloat16, device=self.runner.device
            )
        return gm.replay(batch)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        be = self.runner.backend
        bs = batch.batch_size  # padded to a captured size by the runner
        real = batch.num_real_seqs
        be.cuda_graph_last_page_len[real:bs].fill_(1)  # ok: FC104
        self._check_bucket(bs)
        self.runner.strategy.plan(batch)
        be.cuda_graph_kv_indptr[real + 1 : bs + 1].fill_(int(batch.kv_indptr_cpu[real]))  # expect: FC104

    def _check_bucket(self, bs: int) -> None:
        assert bs in self.runner.graph_manager.graphs  # expect: FC109
