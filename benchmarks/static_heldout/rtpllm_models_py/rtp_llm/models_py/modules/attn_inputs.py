"""Python view of the attention inputs that the C++ engine hands to the model every step."""

from typing import NamedTuple

import torch


class PageTable(NamedTuple):
    indptr_host: torch.Tensor  # [bs + 1], pinned
    indices: torch.Tensor  # [num_pages], on the device
    last_page_len_host: torch.Tensor  # [bs], pinned
    num_pages: int


class AttentionInputs:
    """Wraps the pybind ``PyAttentionInputs``.

    The fields the FlashInfer ops read every step are copied into slots (host tensors keep their ``_host``
    names, the device copies are made here once); everything else is delegated to the C++ object.
    """

    __slots__ = (
        "_raw",
        "device",
        "is_prefill",
        "input_lengths_host",
        "prefix_lengths_host",
        "sequence_lengths_host",
        "cu_seqlens_host",
        "cu_seqlens",
        "block_ids_host",
        "block_ids",
    )

    def __init__(self, raw, *, device: torch.device):
        assert raw.kv_cache_block_id_host.dim() == 2, "block ids must be [batch, max_blocks]"  # expect: FC109
        self._raw = raw
        self.device = device
        self.is_prefill = bool(raw.is_prefill)
        self.input_lengths_host = raw.input_lengths
        self.prefix_lengths_host = raw.prefix_lengths
        self.sequence_lengths_host = raw.sequence_lengths
        bs = self.input_lengths_host.size(0)
        self.cu_seqlens_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        torch.cumsum(self.input_lengths_host, 0, dtype=torch.int32, out=self.cu_seqlens_host[1:])
        self.cu_seqlens = self.cu_seqlens_host.to(device, non_blocking=True)
        self.block_ids_host = raw.kv_cache_block_id_host
        self.block_ids = self.block_ids_host.to(device, non_blocking=True)

    @classmethod
    def from_engine(cls, raw, device: torch.device) -> "AttentionInputs":
        return cls(raw, device=device)

    @property
    def batch_size(self) -> int:
        return self.input_lengths_host.size(0)

    def __getattr__(self, name: str):
        # padding_offset, kv_cache_kernel_block_id, cache_store_inputs, ... stay on the C++ object
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._raw, name)
