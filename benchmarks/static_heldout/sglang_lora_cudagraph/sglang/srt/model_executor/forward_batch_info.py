"""What one forward pass sees: the mode, the token/request tensors and the per-step LoRA batch info."""

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any, List, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention import AttentionBackend
    from sglang.srt.lora.lora_manager import LoRABatchInfo
    from sglang.srt.model_executor.model_runner import MHATokenToKVPool, ModelRunner


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    TARGET_VERIFY = auto()
    IDLE = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY)

    def is_cuda_graph(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    spec_num_draft_tokens: int = 1
    spec_info: Optional[Any] = None
    lora_paths: List[Optional[str]] = field(default_factory=list)
    lora_buffer_ids: Optional[torch.Tensor] = None
    lora_batch_info: Optional["LoRABatchInfo"] = None
    attn_backend: Optional["AttentionBackend"] = None
    token_to_kv_pool: Optional["MHATokenToKVPool"] = None

    @classmethod
    def init_new(cls, batch, model_runner: "ModelRunner") -> "ForwardBatch":
        """Build the device-side batch from the scheduler's host-side one."""
        device = model_runner.device
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens_cpu),
            input_ids=batch.input_ids_cpu.to(device, non_blocking=True),
            req_pool_indices=batch.req_pool_indices_cpu.to(device, non_blocking=True),
            seq_lens=batch.seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=batch.seq_lens_cpu,
            seq_lens_sum=int(batch.seq_lens_cpu.sum()),
            out_cache_loc=batch.out_cache_loc_cpu.to(device, non_blocking=True),
            positions=batch.positions_cpu.to(device, non_blocking=True),
            spec_num_draft_tokens=model_runner.spec_num_draft_tokens,
            attn_backend=model_runner.attn_backend,
            token_to_kv_pool=model_runner.token_to_kv_pool,
        )
        if batch.forward_mode.is_extend():
            ret.extend_seq_lens_cpu = list(batch.extend_lens)
            ret.extend_prefix_lens_cpu = list(batch.prefix_lens)
            ret.extend_seq_lens = torch.tensor(batch.extend_lens, dtype=torch.int32, device=device)
            ret.extend_prefix_lens = torch.tensor(batch.prefix_lens, dtype=torch.int32, device=device)
        if model_runner.lora_manager is not None:
            ret.lora_paths = list(batch.lora_paths)
            model_runner.lora_manager.prepare_lora_batch(ret)
        return ret
