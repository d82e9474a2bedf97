"""Hierarchical radix cache: which prefixes live on the device, which were evicted to host memory.

The scheduler matches a request against the tree between steps. A match whose tail was evicted to the host is
scheduled for load-back (``init_load_back`` allocates device slots and returns a ``LoadBackOp``); the attention
backend starts the copies when the batch's metadata is built, and the forward waits layer by layer. Device
prefixes that are hit often are backed up to the host on the write stream so they can be evicted cheaply.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from .memory_pool import LayerDoneCounter, MHATokenToKVPool, MHATokenToKVPoolHost
from hisrt.global_config import global_config

if TYPE_CHECKING:
    from hisrt.attention.flashinfer_backend import FlashInferAttnBackend


@dataclass
class LoadBackOp:
    host_indices: torch.Tensor
    device_indices: torch.Tensor
    node_ids: List[int]


class HiCacheController:
    def __init__(
        self, mem_pool_device: MHATokenToKVPool, mem_pool_host: MHATokenToKVPoolHost,
        attn_backend: "FlashInferAttnBackend", io_backend: str = "direct",
    ) -> None:
        self.mem_pool_device = mem_pool_device
        self.mem_pool_host = mem_pool_host
        self.attn_backend = attn_backend
        self.num_layers = mem_pool_device.layer_num
        self.load_stream = torch.cuda.Stream()
        self.write_stream = torch.cuda.Stream()
        self.layer_done_counter = LayerDoneCounter(self.num_layers)
        mem_pool_device.register_layer_transfer_counter(self.layer_done_counter)
        # producer index -> device slots of the load in flight (released once its last layer landed)
        self.ongoing_load: Dict[int, List[int]] = {}
        self.ongoing_write: Dict[int, torch.cuda.Event] = {}
        self._backend = io_backend

    # ------------------------------------------------------------------ host -> device

    def load(self, host_indices: torch.Tensor, node_ids: List[int]) -> Optional[LoadBackOp]:
        device_indices = self.mem_pool_device.alloc(host_indices.numel())
        if device_indices is None:
            return None
        return LoadBackOp(host_indices=host_indices, device_indices=device_indices, node_ids=node_ids)

    def start_loading(self, op: LoadBackOp) -> int:
        """Launch the layer-by-layer copy of one load-back; this batch's forward consumes it."""
        producer = self.layer_done_counter.update_producer()
        self.ongoing_load[producer] = op.device_indices.tolist()  # expect: FC101
        self.load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.load_stream):
            for layer_id in range(self.num_layers):
                self.mem_pool_host.load_to_device_per_layer(
                    self.mem_pool_device, op.host_indices, op.device_indices, layer_id
                )
                self.layer_done_counter.events[producer][layer_id].record()
        self.layer_done_counter.set_consumer(producer)
        return producer

    def loading_check(self) -> List[int]:
        """Between steps: release the loads whose last layer has landed."""
        done = [p for p in self.ongoing_load if self.layer_done_counter.events[p][-1].query()]
        for p in done:
            del self.ongoing_load[p]
        return done

    # ------------------------------------------------------------------ device -> host

    def write(self, device_indices: torch.Tensor, node_id: int) -> Optional[torch.Tensor]:
        host_indices = self.mem_pool_host.alloc(device_indices.numel())
        if host_indices is None:
            return None
        # Keep a stream-ordered copy of the slot ids: the tree may free the node's device slots as soon as the
        # backup is acknowledged. The decode graphs' index buffer is idle between replays, so borrow it.
        slots = self.attn_backend.cuda_graph_kv_indices[: device_indices.numel()]
        self.write_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.write_stream):
            slots.copy_(device_indices, non_blocking=True)  # expect: FC104
            self.mem_pool_host.backup_from_device_all_layer(self.mem_pool_device, host_indices, slots)
            done = torch.cuda.Event()
            done.record()
        self.ongoing_write[node_id] = done
        return host_indices


class TreeNode:
    _ids = itertools.count()

    def __init__(self, parent: Optional["TreeNode"] = None) -> None:
        self.id = next(TreeNode._ids)
        self.parent = parent
        self.children: Dict[int, "TreeNode"] = {}
        self.key: List[int] = []
        self.value: Optional[torch.Tensor] = None  # device slots, None once evicted
        self.host_value: Optional[torch.Tensor] = None  # host slots, once backed up
        self.lock_ref = 0
        self.hit_count = 0
        self.last_access_time = time.monotonic()

    @property
    def evicted(self) -> bool:
        return self.value is None


class HiRadixCache:
    def __init__(
        self, token_to_kv_pool: MHATokenToKVPool, cache_controller: HiCacheController,
        write_through_threshold: int = 2,
    ) -> None:
        self.token_to_kv_pool = token_to_kv_pool
        self.cache_controller = cache_controller
        self.write_through_threshold = write_through_threshold
        # the "direct" io backend copies through pageable staging: back up eagerly so eviction never waits
        self.eager_backup = cache_controller._backend == "direct"  # ok: FC103
        self.root = TreeNode()
        self.root.value = torch.empty(0, dtype=torch.int64)
        self.evictable_size_ = 0

    def init_load_back(
        self, last_node: TreeNode, prefix_values: List[torch.Tensor]
    ) -> Tuple[List[torch.Tensor], TreeNode, Optional[LoadBackOp]]:
        """Schedule the host-resident tail of a matched prefix for load-back (between steps)."""
        to_load: List[TreeNode] = []
        node = last_node
        while node.evicted and node.host_value is not None:
            to_load.insert(0, node)
            node = node.parent
        if not to_load:
            return prefix_values, last_node, None
        host_indices = torch.cat([n.host_value for n in to_load])
        if host_indices.numel() < global_config.hicache_load_back_threshold:
            return prefix_values, node, None
        op = self.cache_controller.load(host_indices, [n.id for n in to_load])
        if op is None:
            self.evict(host_indices.numel())
            op = self.cache_controller.load(host_indices, [n.id for n in to_load])
            if op is None:
                return prefix_values, node, None
        offset = 0
        for n in to_load:
            size = n.host_value.numel()
            n.value = op.device_indices[offset : offset + size]
            offset += size
        return prefix_values + [op.device_indices], to_load[-1], op

    def inc_hit(self, node: TreeNode) -> None:
        node.hit_count += 1
        node.last_access_time = time.monotonic()
        if node.hit_count >= self.write_through_threshold and node.host_value is None:
            node.host_value = self.cache_controller.write(node.value, node.id)

    def evict(self, num_tokens: int) -> None:
        leaves, stack = [], [self.root]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if not n.children and not n.evicted and n.lock_ref == 0 and n is not self.root:
                leaves.append(n)
        leaves.sort(key=lambda n: n.last_access_time)
        freed = 0
        for node in leaves:
            if freed >= num_tokens:
                break
            if node.host_value is None and self.eager_backup:
                node.host_value = self.cache_controller.write(node.value, node.id)
            freed += node.value.numel()
            self.token_to_kv_pool.free(node.value)
            if node.host_value is None:
                del node.parent.children[node.key[0]]
            node.value = None
            self.evictable_size_ -= len(node.key)
        self._check_evictable_size()

    def _check_evictable_size(self) -> None:
        assert self.evictable_size_ >= 0, "evictable size went negative"  # ok: FC109
