"""Static device table of soft-prompt embeddings.

Captured prefill graphs read ``embeds`` by address; the per-row slot state is
refreshed in place before every step.
"""

import torch


class EmbeddingSlotTable:
    def __init__(
        self,
        max_slots: int,
        max_virtual_tokens: int,
        hidden_size: int,
        max_batch_size: int,
        dtype: torch.dtype,
        device,
    ) -> None:
        assert max_slots > 0 and max_virtual_tokens > 0, "empty soft-prompt table"  # expect: FC109
        self.max_slots = max_slots
        self.max_virtual_tokens = max_virtual_tokens
        self.hidden_size = hidden_size
        self.device = device
        self.embeds = torch.zeros(max_slots, max_virtual_tokens, hidden_size, dtype=dtype, device=device)
        self.row_slots = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.row_virtual_lens = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.row_slots_cpu = torch.zeros(max_batch_size, dtype=torch.long, pin_memory=True)
        self.row_virtual_lens_cpu = torch.zeros(max_batch_size, dtype=torch.long, pin_memory=True)

    def load_slot(self, slot: int, embeds_host: torch.Tensor) -> None:
        n = embeds_host.shape[0]
        self.embeds[slot, :n].copy_(embeds_host, non_blocking=True)
        self.embeds[slot, n:].zero_()

    def stage_rows(self, slots_cpu: torch.Tensor, lens_cpu: torch.Tensor) -> int:
        bs = slots_cpu.shape[0]
        self.row_slots_cpu[:bs].copy_(slots_cpu.clamp(min=0))
        self.row_virtual_lens_cpu[:bs].copy_(lens_cpu)
        self.row_slots[:bs].copy_(self.row_slots_cpu[:bs], non_blocking=True)  # ok: FC104
        self.row_virtual_lens[:bs].copy_(self.row_virtual_lens_cpu[:bs], non_blocking=True)
        return bs
