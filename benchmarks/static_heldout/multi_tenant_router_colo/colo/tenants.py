"""Tenants colocated on one GPU: their specs and the per-step batch descriptor."""
from __future__ import annotations

import dataclasses
import enum
from typing import List, Optional, Tuple

import torch

# Float workspace per size tier, in MiB; a tier's workspace is shared by its tenants.
_TENANT_WS_MIB = {"small": 64, "large": 192}


class TenantKind(str, enum.Enum):
    CHAT = "chat"  # autoregressive decode
    GUARD = "guard"  # safety classifier: one prefill pass over each prompt, no decode


@dataclasses.dataclass(frozen=True)
class TenantSpec:
    name: str
    kind: TenantKind
    num_layers: int
    hidden_size: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    page_size: int = 16
    num_pages: int = 16384
    max_batch_size: int = 64
    max_prompt_tokens: int = 4096
    ws_tier: str = "small"
    graph_buckets: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    temperature: float = 0.7
    weight: float = 1.0  # fair-share weight
    eos_token_id: int = 2
    num_labels: int = 4  # guard tenants only


@dataclasses.dataclass
class StepBatch:
    """One tenant's batch for one step, built by its queue."""

    tenant: str
    rids: List[str]
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor
    page_lists: List[List[int]]
    last_page_len: torch.Tensor
    out_cache_loc: torch.Tensor
    qo_indptr_gpu: Optional[torch.Tensor] = None  # guard prompts (ragged)
    qo_indptr_cpu: Optional[torch.Tensor] = None

    @property
    def size(self) -> int:
        return len(self.rids)
