"""Worker side of the layer-wise connector: the four per-step hooks."""
from __future__ import annotations

import logging
from typing import List, Optional, Set

import torch

from kvconn.config import ConnectorConfig
from kvconn.metadata import ConnectorMetadata, ReqMeta
from kvconn.transfer import LayerTransferStreams, RemoteAgent

logger = logging.getLogger(__name__)


class LayerwiseConnectorWorker:
    def __init__(self, cfg: ConnectorConfig, device: torch.device, dtype: torch.dtype = torch.bfloat16):
        self.cfg = cfg
        self.device = device
        self.dtype = dtype
        self.streams = LayerTransferStreams(cfg.num_layers, device)
        self.agent = RemoteAgent(cfg.transfer_backend, cfg.engine_id)
        self.remote_layout = cfg.remote_layout
        self.kv_caches: List[torch.Tensor] = []
        self._kv_layout = "NHD"
        self._meta: Optional[ConnectorMetadata] = None
        self._block_numel = 2 * cfg.block_size * cfg.num_kv_heads * cfg.head_dim
        # remote reads land here when the remote layout differs from ours
        self.load_staging = torch.empty(cfg.staging_blocks * self._block_numel, dtype=dtype, device=device)
        self._save_scratch: Optional[torch.Tensor] = None
        self._saved_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self._loading_blocks: Set[int] = set()
        self._inflight_saves = 0

    # ---------------------------------------------------------------- registration
    def register_kv_caches(self, kv_caches: List[torch.Tensor]) -> None:
        assert len(kv_caches) == self.cfg.num_layers, "one KV cache per layer"  # expect: FC109
        self.kv_caches = list(kv_caches)

    def register_kv_layout(self, wrapper) -> None:
        # the transfer descriptors depend on whether heads or tokens are outermost
        self._kv_layout = wrapper._kv_layout  # expect: FC103

    # ---------------------------------------------------------------- loads
    def start_load_kv(self, meta: ConnectorMetadata) -> None:
        self._meta = meta
        loads = [r for r in meta.requests if r.load_remote]
        if not loads:
            return
        self.streams.reset()
        # blocks being filled must not be evicted or handed out before the layer lands
        self._loading_blocks = {b for r in loads for b in r.block_ids_np.tolist()}  # ok: FC101
        need = max(len(r.block_ids_np) for r in loads) * self._block_numel
        if self.load_staging.numel() < need:
            self.load_staging = torch.empty(need, dtype=self.dtype, device=self.device)  # expect: FC107
        self.streams.load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.streams.load_stream):
            for layer in range(self.cfg.num_layers):
                self._issue_layer_load(layer, loads)

    def _issue_layer_load(self, layer: int, loads: List[ReqMeta]) -> None:
        kv = self.kv_caches[layer]
        cfg = self.cfg
        for req in loads:
            if self._kv_layout == self.remote_layout:  # ok: FC103
                # same layout: RDMA straight into our blocks
                dst_ids = req.block_ids.tolist()  # expect: FC101
                self.agent.read_into_blocks(req.remote_engine_id, layer, req.remote_block_ids, kv, dst_ids)
                continue
            nblk = len(req.block_ids_np)
            staged = self.load_staging[: nblk * self._block_numel]
            self.agent.read_blocks(req.remote_engine_id, layer, req.remote_block_ids, staged)
            src = staged.view(nblk, 2, cfg.num_kv_heads, cfg.block_size, cfg.head_dim)
            kv.index_copy_(0, req.block_ids, src.transpose(2, 3))
        self.streams.load_events[layer].record(self.streams.load_stream)

    def wait_for_layer_load(self, layer: int) -> None:
        meta = self._meta
        if meta is None or meta.num_loads == 0:
            return
        torch.cuda.current_stream().wait_event(self.streams.load_events[layer])  # ok: FC101
        if layer == self.cfg.num_layers - 1:
            self._loading_blocks = set()

    # ---------------------------------------------------------------- saves
    def save_kv_layer(self, layer: int, kv_layer: torch.Tensor, attn_meta: object) -> None:
        meta = self._meta
        if meta is None or meta.num_saves == 0:
            return
        streams = self.streams
        if layer > 0:
            # the gather scratch is reused layer after layer; the agent may still be reading it
            streams.save_events[layer - 1].synchronize()  # expect: FC101
        if self._save_scratch is None:
            shape = (2, self.cfg.save_capacity_tokens, self.cfg.num_kv_heads, self.cfg.head_dim)
            self._save_scratch = torch.empty(shape, dtype=kv_layer.dtype, device=self.device)  # ok: FC107
        streams.save_stream.wait_stream(torch.cuda.current_stream())
        bs = self.cfg.block_size
        with torch.cuda.stream(streams.save_stream):
            for req in meta.requests:
                if req.save_slots is None:
                    continue
                slots = req.save_slots[req.save_slots >= 0]  # expect: FC101
                n = slots.numel()
                blk, off = slots // bs, slots % bs
                self._save_scratch[0, :n] = kv_layer[blk, 0, off]
                self._save_scratch[1, :n] = kv_layer[blk, 1, off]
                self.agent.write_blocks(req.remote_engine_id, layer, self._save_scratch[:, :n], req.remote_block_ids)
                self._saved_tokens.add_(n)
                self._inflight_saves += 1
            streams.save_events[layer].record(streams.save_stream)

    def wait_for_save(self) -> None:
        meta = self._meta
        if meta is None:
            return
        if meta.num_saves:
            torch.cuda.current_stream().wait_stream(self.streams.save_stream)
            self._inflight_saves = 0
            self._check_inflight()
            logger.debug("connector step %d: %s tokens saved so far", meta.step, self._saved_tokens)  # ok: FC101
            if meta.step % 1000 == 0:
                logger.info(f"kv connector: {self._saved_tokens} tokens shipped after {meta.step} steps")  # expect: FC101
        self._meta = None

    def _check_inflight(self) -> None:
        assert self._inflight_saves >= 0, "save accounting went negative"  # ok: FC109

    def loading_blocks(self) -> Set[int]:
        return set(self._loading_blocks)
