"""Static configuration of the pipeline-parallel micro-batch engine and its FlashInfer workspaces."""
import dataclasses
import functools
import os
from typing import Optional, Tuple

import torch

PAGE_SIZE = 16
assert PAGE_SIZE & (PAGE_SIZE - 1) == 0, "PAGE_SIZE must be a power of two"  # ok: FC109

PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024
DECODE_BUCKETS: Tuple[int, ...] = (1, 2, 4, 8, 16, 32)
_WS_BYTES = {"window": 96 << 20}
_OVERFLOW_WS: Optional[torch.Tensor] = None


@dataclasses.dataclass
class PipelineConfig:
    num_stages: int = 4
    layers_per_stage: int = 8
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    max_micro_batches: int = 4
    max_batch_per_mb: int = 32
    max_pages: int = 65536
    max_num_tokens: int = 8192
    window_layers: Tuple[int, ...] = ()
    window_size: int = 4096
    shared_prefix_pages: int = 0
    decode_backend: str = "fa2"
    eos_token_id: int = 2
    device: str = "cuda"

    def planner_workspace_bytes(self) -> int:
        """Split-k partial outputs (fp32 values and LSE) of the largest step, plus the int scratch."""
        per_token = self.num_qo_heads * (self.head_dim + 1) * 4
        return 2 * self.max_num_tokens * per_token + (8 << 20)


@functools.lru_cache(maxsize=None)
def prefill_workspace(device: str) -> torch.Tensor:
    return torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def window_workspace(device: str) -> torch.Tensor:
    return torch.zeros(_WS_BYTES["window"], dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def stage_workspace(stage_id: int, device: str) -> torch.Tensor:
    nbytes = int(os.environ.get("PP_STAGE_WORKSPACE_MIB", 128)) << 20  # one per stage: its prefix level stays planned
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)  # expect: FC106


def trtllm_decode_workspace(cfg: PipelineConfig, zero: bool) -> torch.Tensor:
    ws = torch.empty(cfg.planner_workspace_bytes(), dtype=torch.uint8, device=cfg.device)  # ok: FC105
    if zero:
        ws.zero_()
    return ws


def overflow_workspace(cfg: PipelineConfig) -> torch.Tensor:
    global _OVERFLOW_WS
    if _OVERFLOW_WS is None:
        nbytes = cfg.max_batch_per_mb * cfg.num_qo_heads * cfg.head_dim * 512
        _OVERFLOW_WS = torch.empty(nbytes, dtype=torch.uint8, device=cfg.device)  # expect: FC105
    return _OVERFLOW_WS
