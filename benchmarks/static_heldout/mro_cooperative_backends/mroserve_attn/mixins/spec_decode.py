"""Draft-model side of speculative decoding."""

from __future__ import annotations

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from mroserve.batch import ForwardBatch


class SpecDecodeMixin:
    """State the draft model keeps between its draft steps and the target's verify.

    Draft steps are ordinary decode steps (graph replays when the bucket exists).
    The draft's extend pass after a verify attends only within the verified
    chunk, so it runs a ragged wrapper over the chunk instead of the paged path.
    """

    @classmethod
    def create(cls, cfg, device, **kwargs):
        kwargs.setdefault("num_draft_steps", cfg.num_draft_steps)
        return super().create(cfg, device, **kwargs)

    def __init__(self, cfg, device, *, num_draft_steps: int = 1, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        self.num_draft_steps = num_draft_steps
        self.step_index = 0
        self.draft_positions = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=self.device)
        self.draft_extend_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend="fa2")

    def _plan_draft_extend(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        self.draft_extend_wrapper.plan(  # expect: FC102
            fb.qo_indptr,
            fb.qo_indptr,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            causal=True,
            q_data_type=cfg.dtype,
        )

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.draft_positions = fb.positions.clone()  # expect: FC107
        if fb.forward_mode.is_extend():
            self._plan_draft_extend(fb)
            return
        super().init_forward_metadata(fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        n = fb.batch_size
        # Rows rolled back at the last verify: refresh the device copy before the plans.
        self.graph_kv_last_page_len[:n].copy_(fb.kv_last_page_len[:n], non_blocking=True)  # ok: FC104
        super().init_forward_metadata_replay_cuda_graph(bs, fb)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if self.step_index >= self.num_draft_steps:
            raise RuntimeError(f"draft step {self.step_index} past num_draft_steps={self.num_draft_steps}")
        return super().forward_decode(q, k, v, layer, fb)

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.draft_extend_wrapper.run(q, k, v)

    def rollback_rejected(self, n: int, rejected: torch.Tensor) -> None:
        """Give back the KV slots of rejected draft tokens on each request's last page."""
        self.graph_kv_last_page_len[:n].sub_(rejected).clamp_(min=1)  # expect: FC104
