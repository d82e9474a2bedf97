"""Device and host KV pools of the hierarchical cache.

The device pool holds one K and one V buffer per layer, indexed by token slot. The host pool mirrors it in pinned
memory, ``host_to_device_ratio`` times larger. A load-back copies one layer at a time from host to device on the
controller's load stream and records one event per layer; ``get_kv_buffer`` makes the compute stream wait for
that layer's event before attention reads it, so layer 0 runs while layers 1.. are still in flight.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from sgl_kernel.kvcacheio import transfer_kv_all_layer


class LayerDoneCounter:
    """Two sets of per-layer events: the load being consumed by this forward and the one being produced."""

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.events: List[List[torch.cuda.Event]] = [
            [torch.cuda.Event() for _ in range(num_layers)] for _ in range(2)
        ]
        self.producer = 0
        self.consumer = -1

    def update_producer(self) -> int:
        self.producer = (self.producer + 1) % 2
        return self.producer

    def set_consumer(self, index: int) -> None:
        self.consumer = index

    def reset(self) -> None:
        self.consumer = -1

    def wait_until(self, layer_id: int) -> None:
        if self.consumer < 0:
            return
        torch.cuda.current_stream().wait_event(self.events[self.consumer][layer_id])  # ok: FC101


class MHATokenToKVPool:
    def __init__(
        self, size: int, page_size: int, dtype: torch.dtype, head_num: int, head_dim: int, layer_num: int,
        device: str,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.layer_num = layer_num
        self.device = device
        # slot 0 is the padding slot that dummy requests write into
        self.k_buffer = [
            torch.zeros(size + page_size, head_num, head_dim, dtype=dtype, device=device) for _ in range(layer_num)
        ]
        self.v_buffer = [
            torch.zeros(size + page_size, head_num, head_dim, dtype=dtype, device=device) for _ in range(layer_num)
        ]
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64, device=device)
        self.layer_transfer_counter: Optional[LayerDoneCounter] = None

    def register_layer_transfer_counter(self, counter: LayerDoneCounter) -> None:
        self.layer_transfer_counter = counter

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > self.free_slots.numel():
            return None
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return select

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel() == 0:
            return
        self.free_slots = torch.cat((self.free_slots, free_index))

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id)
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.dtype)
        self.v_buffer[layer_id][loc] = v.to(self.dtype)


class MHATokenToKVPoolHost:
    def __init__(self, device_pool: MHATokenToKVPool, host_to_device_ratio: float, pin_memory: bool = True) -> None:
        assert host_to_device_ratio >= 1, "the host pool must be at least as large as the device pool"  # expect: FC109
        self.device_pool = device_pool
        self.size = int(device_pool.size * host_to_device_ratio)
        self.layer_num = device_pool.layer_num
        shape = (self.size, device_pool.head_num, device_pool.head_dim)
        self.k_buffer = [torch.empty(shape, dtype=device_pool.dtype, pin_memory=pin_memory) for _ in range(self.layer_num)]
        self.v_buffer = [torch.empty(shape, dtype=device_pool.dtype, pin_memory=pin_memory) for _ in range(self.layer_num)]
        self.free_slots = torch.arange(self.size, dtype=torch.int64)

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        if need_size > self.free_slots.numel():
            return None
        select = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return select

    def free(self, indices: torch.Tensor) -> None:
        self.free_slots = torch.cat((self.free_slots, indices))

    def load_to_device_per_layer(
        self, device_pool: MHATokenToKVPool, host_indices: torch.Tensor, device_indices: torch.Tensor, layer_id: int,
    ) -> None:
        # gather on the host into pinned staging, then one asynchronous copy per layer and buffer
        k = self.k_buffer[layer_id].index_select(0, host_indices).pin_memory()
        v = self.v_buffer[layer_id].index_select(0, host_indices).pin_memory()
        device_pool.k_buffer[layer_id].index_copy_(0, device_indices, k.to(device_pool.device, non_blocking=True))
        device_pool.v_buffer[layer_id].index_copy_(0, device_indices, v.to(device_pool.device, non_blocking=True))

    def backup_from_device_all_layer(
        self, device_pool: MHATokenToKVPool, host_indices: torch.Tensor, device_indices: torch.Tensor,
    ) -> None:
        # one kernel for all layers: it scatters straight into the pinned host rows on the current stream
        transfer_kv_all_layer(
            src_k_layers=device_pool.k_buffer,
            dst_k_layers=self.k_buffer,
            src_v_layers=device_pool.v_buffer,
            dst_v_layers=self.v_buffer,
            src_indices=device_indices,
            dst_indices=host_indices.to(device_pool.device, non_blocking=True),
            num_layers=self.layer_num,
        )
