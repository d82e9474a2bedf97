"""Ragged prefill attention for scoring: every sequence attends causally to itself, nothing is cached
except for the rows that go on to generate a critique."""

from __future__ import annotations

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from rmserve.batching import RaggedBatch
from rmserve.protocols import PolicyHandle
from rmserve.settings import RewardSettings


class RaggedScoreAttention:
    # 192 MiB covered the 64k-token batches of the first deployment
    SCORE_WS_BYTES = 192 << 20

    def __init__(self, settings: RewardSettings, device: torch.device):
        self.settings = settings
        self.device = device
        self.workspace = torch.empty(self.SCORE_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.sm_scale = settings.head_dim ** -0.5

    def plan_batch(self, batch: RaggedBatch) -> None:
        s = self.settings
        self.ragged.plan(  # expect: FC102
            batch.cu_seqlens_gpu,
            batch.cu_seqlens_gpu,
            num_qo_heads=s.num_q_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim_qk=s.head_dim,
            causal=True,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )

    def share_workspace_with(self, policy: PolicyHandle) -> None:
        """The policy's rollout attention runs between our steps: lend it our float workspace instead of
        keeping a second one on a GPU that is already split in two."""
        policy.set_attention_workspace(self.ragged._float_workspace_buffer)  # expect: FC103

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged.run(q, k, v)
