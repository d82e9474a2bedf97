"""Engine configuration and the module-level sizes the engine allocates its workspaces with."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import chain

import torch

# Float workspace of the shared-prefix (cascade) wrappers.
CASCADE_WORKSPACE_BYTES = 128 * 1024 * 1024

# Prefill workspaces per kind of layer group; windowed groups plan over at most a window of KV.
_WS_TIERS = {"full": 256 << 20, "window": 64 << 20}

# Verify (speculative decoding) wrappers; operators override it from the environment.
VERIFY_WS_BYTES = int(os.getenv("DENSEFI_VERIFY_WS_MB", "256")) << 20

# Ragged prefill workspace: a floor that start-up tuning raises to what the engine's limits need
# (tune_prefill_workspace runs before any workspace is allocated).
PREFILL_WS_BYTES = 64 << 20

assert _WS_TIERS["window"] <= _WS_TIERS["full"], "a window tier larger than the full tier"  # ok: FC109

_GROUP_KINDS = ("full", "window")


def tune_prefill_workspace(max_num_batched_tokens: int, num_qo_heads: int, head_dim: int) -> int:
    """Raise PREFILL_WS_BYTES to what one full chunk of prefill tokens needs (split-k outputs and LSE, fp32)."""
    global PREFILL_WS_BYTES
    need = 2 * max_num_batched_tokens * num_qo_heads * (head_dim + 1) * 4
    PREFILL_WS_BYTES = max(PREFILL_WS_BYTES, need)
    return PREFILL_WS_BYTES


def group_kind(group: str) -> str:
    """`full` or `window`: the kind of a layer group name (`full`, `win4096`, ...)."""
    return _GROUP_KINDS[group.startswith("win")]


@dataclass
class EngineConfig:
    # model shape
    num_layers: int = 32
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    dtype: torch.dtype = torch.bfloat16
    # paged KV cache
    page_size: int = 16
    num_gpu_pages: int = 65536
    num_kv_cache_groups: int = 1
    # scheduler limits
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    # sliding-window layers: layer id -> window, and the distinct windows
    layer_window: dict[int, int] = field(default_factory=dict)
    window_sizes: tuple[int, ...] = ()
    # CUDA graphs and features
    cudagraph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
    num_spec_tokens: int = 0
    enable_cascade: bool = False
    cascade_min_prefix: int = 1024
    use_trtllm_decode: bool = False
    use_trtllm_prefill: bool = False
    kv_budget_tokens: int = 0
    num_copy_streams: int = 2
    workspace_bytes: int = 384 << 20
    eos_token_id: int = 128001

    def __post_init__(self) -> None:
        assert all(bs > 0 for bs in self.cudagraph_batch_sizes), "capture sizes must be positive"  # expect: FC109
        self.cudagraph_batch_sizes = tuple(sorted({*self.cudagraph_batch_sizes}))
        self.window_sizes = tuple(sorted({*self.window_sizes, *self.layer_window.values()}))
        if bad := [i for i in self.layer_window if not 0 <= i < self.num_layers]:
            raise ValueError(f"layer_window names layers {bad} outside 0..{self.num_layers - 1}")

    @property
    def layer_groups(self) -> tuple[str, ...]:
        return tuple(chain(("full",), (f"win{w}" for w in self.window_sizes)))

    @property
    def max_pages_per_seq(self) -> int:
        return -(-self.max_model_len // self.page_size)

    def group_of_layer(self, layer_id: int) -> str:
        return f"win{w}" if (w := self.layer_window.get(layer_id)) is not None else "full"

    def layers_of(self, group: str) -> list[int]:
        return [i for i in range(self.num_layers) if self.group_of_layer(i) == group]
