from __future__ import annotations

from typing import List, Tuple

import torch


class ReqToTokenPool:
    """Maps (request slot, position) to a KV token slot."""

    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.req_to_token = torch.zeros(size, max_context_len, dtype=torch.int32, device=device)
        self.free_slots: List[int] = list(range(size))

    def alloc(self) -> int:
        if not self.free_slots:
            raise MemoryError("no free request slots")
        return self.free_slots.pop()

    def free(self, slot: int) -> None:
        self.free_slots.append(slot)


class TokenToKVPool:
    """Token-granular KV cache (page size 1). Slot 0 is reserved for padded rows of captured graphs."""

    def __init__(self, size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype, device: torch.device):
        self.size = size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.k_buffer = [torch.zeros(size, num_kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(size, num_kv_heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.free_slots = list(range(size - 1, 0, -1))

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free_slots):
            raise MemoryError(f"need {n} KV slots, {len(self.free_slots)} free")
        out = self.free_slots[-n:]
        del self.free_slots[-n:]
        return out

    def release(self, slots: List[int]) -> None:
        self.free_slots.extend(slots)

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        k, v = self.k_buffer[layer_id], self.v_buffer[layer_id]
        return k.unsqueeze(1), v.unsqueeze(1)  # [slots, page_size=1, heads, dim]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k
        self.v_buffer[layer_id][loc] = v
