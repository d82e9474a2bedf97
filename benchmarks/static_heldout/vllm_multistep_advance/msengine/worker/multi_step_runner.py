"""Multi-step model runner: ``num_steps`` decode steps per scheduler call.

Between steps the sampled ids stay on the device: ``advance_step`` feeds them to the next step's inputs
and re-plans FlashInfer from host mirrors it advances alongside. Outputs are pythonized once per call,
or on the output thread when the engine runs with async output processing.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Optional

import torch

from msengine.worker.model_runner import GPUModelRunner, ModelInputForGPU

logger = logging.getLogger(__name__)


@dataclass
class StatefulModelInput:
    frozen_model_input: ModelInputForGPU
    num_steps: int = 1
    num_seqs: int = -1
    num_queries: int = -1
    cached_outputs: list = field(default_factory=list)
    cow_positions: Optional[torch.Tensor] = None  # rows' page slots re-pointed after copy-on-write
    cow_dst_blocks: Optional[torch.Tensor] = None
    async_output: bool = False


class MultiStepModelRunner:
    def __init__(self, base: GPUModelRunner, eos_token_id: int):
        self._base = base
        self.eos_token_id = eos_token_id
        self.device = base.device
        self._sampled_ids = torch.zeros(base.max_num_seqs, dtype=torch.long, device=base.device)
        self._pinned: Optional[torch.Tensor] = None
        self._outputs: "queue.Queue[tuple]" = queue.Queue()
        self._results: dict[int, list] = {}
        self._output_thread = threading.Thread(target=self._drain_outputs, daemon=True)
        self._output_thread.start()

    # ------------------------------------------------------------------ per call
    def execute_model(self, model_input: StatefulModelInput, kv_caches: list) -> Optional[list]:
        frozen = model_input.frozen_model_input
        n = frozen.num_rows
        sampled = self._sampled_ids[:n]
        for step in range(model_input.num_steps):
            if step > 0 and self._advance_to_next_step(model_input, sampled):
                break
            hidden = self._base.run_step(frozen, kv_caches)
            logits = self._base.compute_logits(hidden[:n])
            torch.argmax(logits, dim=-1, out=sampled)
            model_input.cached_outputs.append(sampled.clone())
        return self._pythonize(model_input)

    def _advance_to_next_step(self, model_input: StatefulModelInput, sampled: torch.Tensor) -> bool:
        frozen = model_input.frozen_model_input
        if (sampled == self.eos_token_id).all():  # expect: FC101
            return True
        frozen.attn_metadata.advance_step(
            frozen, sampled, self._base.block_size, model_input.num_seqs, model_input.num_queries
        )
        if model_input.cow_positions is not None:
            self._apply_cow(frozen, model_input.cow_positions, model_input.cow_dst_blocks)
        return False

    def _apply_cow(self, frozen: ModelInputForGPU, positions: torch.Tensor, dst_blocks: torch.Tensor) -> None:
        # a block forked by beam/parallel sampling was copied on write between two steps:
        # re-point the rows' page ids at the copy
        md = frozen.attn_metadata
        md.paged_kv_indices.index_copy_(0, positions, dst_blocks)  # expect: FC104

    # ------------------------------------------------------------------ outputs
    def _pythonize(self, model_input: StatefulModelInput) -> Optional[list]:
        steps = torch.stack(model_input.cached_outputs)
        total = steps.numel()
        if self._pinned is None or self._pinned.numel() < total:
            self._pinned = torch.empty(2 * total, dtype=torch.long, pin_memory=True)  # ok: FC107
        host = self._pinned[:total]
        host.copy_(steps.flatten(), non_blocking=True)
        if model_input.async_output:
            done = torch.cuda.Event()
            done.record()
            self._outputs.put((id(model_input), done, host, steps.shape))
            return None
        ids = host.tolist()  # expect: FC101
        width = steps.shape[1]
        return [ids[i * width : (i + 1) * width] for i in range(steps.shape[0])]

    def _drain_outputs(self) -> None:
        while True:
            key, done, host, shape = self._outputs.get()
            done.synchronize()  # ok: FC101
            ids = host.tolist()
            self._results[key] = [ids[i * shape[1] : (i + 1) * shape[1]] for i in range(shape[0])]
