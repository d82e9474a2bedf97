"""GPU slots for the LoRA adapters of the running batches (A and B weights per layer)."""

from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

EMPTY_SLOT = "__empty__"


class LoRAAdapter:
    def __init__(self, name: str, rank: int, scaling: float, weights: Sequence[Tuple[torch.Tensor, torch.Tensor]]):
        self.name = name
        self.rank = rank
        self.scaling = scaling
        self.weights = list(weights)


class LoRAMemoryPool:
    def __init__(
        self,
        *,
        num_layers: int,
        in_features: int,
        out_features: int,
        max_loras_per_batch: int,
        max_lora_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        assert max_loras_per_batch > 0, "max_loras_per_batch must be positive"  # expect: FC109
        self.max_loras_per_batch = max_loras_per_batch
        self.max_lora_rank = max_lora_rank
        self.A_buffer: List[torch.Tensor] = [
            torch.zeros(max_loras_per_batch, max_lora_rank, in_features, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.B_buffer: List[torch.Tensor] = [
            torch.zeros(max_loras_per_batch, out_features, max_lora_rank, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.uid_to_buffer_id: Dict[Optional[str], int] = {}
        self.buffer_id_to_uid: List[Optional[str]] = [EMPTY_SLOT] * max_loras_per_batch

    def get_buffer_id(self, uid: Optional[str]) -> int:
        return self.uid_to_buffer_id[uid]

    def prepare_lora_batch(self, cur_uids: Set[Optional[str]], loras: Dict[str, LoRAAdapter]) -> None:
        """Make every adapter of the batch resident, evicting adapters the batch does not use."""

        def free_slot() -> int:
            for slot, uid in enumerate(self.buffer_id_to_uid):
                if uid == EMPTY_SLOT:
                    return slot
            for slot, uid in enumerate(self.buffer_id_to_uid):
                if uid not in cur_uids:
                    self.uid_to_buffer_id.pop(uid, None)
                    return slot
            raise ValueError(f"{len(cur_uids)} adapters do not fit {self.max_loras_per_batch} slots")

        for uid in cur_uids:
            if uid in self.uid_to_buffer_id:
                continue
            slot = free_slot()
            self._load_to_slot(slot, None if uid is None else loras[uid])
            self.uid_to_buffer_id[uid] = slot
            self.buffer_id_to_uid[slot] = uid

    def _load_to_slot(self, slot: int, adapter: Optional[LoRAAdapter]) -> None:
        assert len(self.buffer_id_to_uid) == self.max_loras_per_batch, "slot table out of sync"  # ok: FC109
        if adapter is None:
            # the base model: a zero delta
            for a, b in zip(self.A_buffer, self.B_buffer):
                a[slot].zero_()
                b[slot].zero_()
            return
        for layer, (wa, wb) in enumerate(adapter.weights):
            self.A_buffer[layer][slot, : wa.shape[0]].copy_(wa, non_blocking=True)
            self.B_buffer[layer][slot, :, : wb.shape[1]].copy_(wb, non_blocking=True)
