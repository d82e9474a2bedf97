"""Layerwise KV connector: loads layer i+1 while layer i computes, saves each layer as it finishes.

Scheduler side: finds cached prefix chunks and builds the step's connector metadata.
Worker side: vLLM calls ``start_load_kv`` before the forward, ``wait_for_layer_load`` and
``save_kv_layer`` inside every attention layer, and ``wait_for_save`` after the forward.
"""
from __future__ import annotations

import enum
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from lmc_connector.attention.flashinfer_builder import FlashInferMetadata
from lmc_connector.config import ConnectorConfig, EngineLimits
from lmc_connector.forward_context import ForwardContext
from lmc_connector.storage.host_backend import HostKVStore, chunk_keys

logger = logging.getLogger(__name__)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


@dataclass
class LoadSpec:
    req_id: str
    keys: List[str]
    num_tokens: int


@dataclass
class SaveSpec:
    req_id: str
    keys: List[str]
    num_tokens: int


@dataclass
class LayerwiseConnectorMetadata:
    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    load_slots_cpu: Optional[torch.Tensor] = None
    num_load_tokens: int = 0
    num_scheduled_tokens: int = 0


class LayerwiseKVConnector:
    def __init__(self, cfg: ConnectorConfig, limits: EngineLimits, role: KVConnectorRole, model_tag: str = "") -> None:
        self.cfg = cfg
        self.role = role
        self.model_tag = model_tag
        self.num_layers = limits.num_layers
        self.block_size = limits.block_size
        self.store = HostKVStore(cfg, limits)
        self.device = torch.device("cuda")
        self.load_stream = torch.cuda.Stream()
        self.save_stream = torch.cuda.Stream()
        self.layer_names: List[str] = []
        self.layer_index: Dict[str, int] = {}
        self.kv_caches: Dict[str, torch.Tensor] = {}
        self.load_events = [torch.cuda.Event() for _ in range(limits.num_layers)]
        self.slot_buf = torch.zeros(limits.max_num_batched_tokens, dtype=torch.int64, device=self.device)
        self.host_staging: Dict[int, torch.Tensor] = {}
        self._meta: Optional[LayerwiseConnectorMetadata] = None
        self._pending: "queue.Queue[Optional[Tuple[int, torch.cuda.Event, torch.Tensor, List[str]]]]" = queue.Queue()
        self._drain = threading.Thread(target=self._drain_saves, name="lmc-save-drain", daemon=True)
        self._drain.start()
        # scheduler-side state
        self._matched: Dict[str, LoadSpec] = {}

    # =========================================================== scheduler side
    def get_num_new_matched_tokens(self, req_id: str, token_ids: Sequence[int], num_computed_tokens: int) -> Tuple[int, bool]:
        keys = chunk_keys(token_ids, self.cfg.chunk_size, self.model_tag)
        hits = self.store.lookup_prefix(keys)
        hit_tokens = hits * self.cfg.chunk_size
        if hit_tokens <= num_computed_tokens:
            return 0, False
        self._matched[req_id] = LoadSpec(req_id=req_id, keys=keys[:hits], num_tokens=hit_tokens)
        return hit_tokens - num_computed_tokens, False

    def build_connector_meta(self, new_reqs: Dict[str, Tuple[Sequence[int], List[int]]], num_scheduled_tokens: int) -> LayerwiseConnectorMetadata:
        """``new_reqs``: req_id -> (prompt token ids, slot of every prompt token)."""
        meta = LayerwiseConnectorMetadata(num_scheduled_tokens=num_scheduled_tokens)
        slots: List[int] = []
        for req_id, (token_ids, token_slots) in new_reqs.items():
            spec = self._matched.pop(req_id, None)
            if spec is not None:
                meta.loads.append(spec)
                slots.extend(token_slots[: spec.num_tokens])
            keys = chunk_keys(token_ids, self.cfg.chunk_size, self.model_tag)
            if keys:
                for key in keys:
                    self.store.reserve(key)
                meta.saves.append(SaveSpec(req_id=req_id, keys=keys, num_tokens=len(keys) * self.cfg.chunk_size))
        meta.load_slots_cpu = torch.tensor(slots, dtype=torch.int64).pin_memory()
        meta.num_load_tokens = len(slots)
        return meta

    # ============================================================== worker side
    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]) -> None:
        assert len(kv_caches) == self.num_layers, "one KV cache per attention layer"  # expect: FC109
        self.kv_caches = dict(kv_caches)
        self.layer_names = list(kv_caches)
        self.layer_index = {name: i for i, name in enumerate(self.layer_names)}
        logger.info("connector on %s with %d layers", self.store._backend, len(self.layer_names))  # ok: FC103

    def bind_connector_metadata(self, meta: Optional[LayerwiseConnectorMetadata]) -> None:
        self._meta = meta

    def start_load_kv(self, forward_context: ForwardContext) -> None:
        if self._meta is None or not self._meta.loads:
            return
        self.load_stream.wait_stream(torch.cuda.current_stream())
        self._launch_layer_load(0)

    def _launch_layer_load(self, layer: int) -> None:
        meta = self._meta
        if meta is None or not meta.loads or layer >= self.num_layers:
            return
        n = meta.num_load_tokens
        if self.slot_buf.numel() < n:
            self.slot_buf.resize_(n)  # expect: FC107
        kv = self.kv_caches[self.layer_names[layer]]
        with torch.cuda.stream(self.load_stream):
            self.slot_buf[:n].copy_(meta.load_slots_cpu[:n], non_blocking=True)
            off = 0
            for spec in meta.loads:
                for c, key in enumerate(spec.keys):
                    m = min(self.cfg.chunk_size, spec.num_tokens - c * self.cfg.chunk_size)
                    src = self.store.chunk_view(key, layer)[:, :m].to(self.device, non_blocking=True)
                    slots = self.slot_buf[off : off + m]
                    kv[slots // self.block_size, :, slots % self.block_size] = src.transpose(0, 1)
                    off += m
            self.load_events[layer].record(self.load_stream)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._meta is None or not self._meta.loads:
            return
        i = self.layer_index[layer_name]
        torch.cuda.current_stream().wait_event(self.load_events[i])  # ok: FC101
        self._launch_layer_load(i + 1)

    def _staging(self, layer: int, n: int, kv: torch.Tensor) -> torch.Tensor:
        buf = self.host_staging.get(layer)
        if buf is None or buf.shape[1] < n:
            self.host_staging[layer] = torch.empty(2, n, kv.shape[-2], kv.shape[-1], dtype=kv.dtype, pin_memory=True)  # ok: FC107
        return self.host_staging[layer]

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: FlashInferMetadata) -> None:
        meta = self._meta
        if meta is None or not meta.saves:
            return
        i = self.layer_index[layer_name]
        slot_mapping = attn_metadata.slot_mapping[: meta.num_scheduled_tokens]
        valid = slot_mapping >= 0
        slots = slot_mapping[valid]  # expect: FC101
        n = sum(s.num_tokens for s in meta.saves)
        slots = slots[:n]
        w = attn_metadata.decode_wrapper
        layout = w._kv_layout if w is not None else "NHD"  # expect: FC103
        computed = torch.cuda.Event()
        computed.record()
        with torch.cuda.stream(self.save_stream):
            self.save_stream.wait_event(computed)
            if layout == "HND":
                tokens = kv_layer[slots // self.block_size, :, :, slots % self.block_size]
            else:
                tokens = kv_layer[slots // self.block_size, :, slots % self.block_size]
            staging = self._staging(i, n, kv_layer)
            staging[:, :n].copy_(tokens.transpose(0, 1), non_blocking=True)  # ok: FC101
            done = torch.cuda.Event()
            done.record(self.save_stream)
        keys = [k for s in meta.saves for k in s.keys]
        self._pending.put((i, done, staging, keys))

    def wait_for_save(self) -> None:
        if self._meta is None or not self._meta.saves:
            return
        # the staging buffers are reused by the next step's saves
        self.save_stream.synchronize()  # expect: FC101
        self._meta = None

    def _drain_saves(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            layer, done, staging, keys = item
            done.synchronize()  # ok: FC101
            self.store.put_layer(layer, keys, staging)

    def shutdown(self) -> None:
        self._pending.put(None)
        self._drain.join(timeout=5.0)
