"""The decode stage: admits prefilled requests, steps them through the bucket graphs."""

from typing import Dict, List

import numpy as np
import torch

from epd.config import EPDConfig
from epd.protocol import KVPageHandle
from epd.transfer import TransferEngine
from epd_decode.decode_attn import DecodeAttnBackend, DecodeBatch
from epd_decode.graph_runner import DecodeGraphRunner
from epd_decode.kv_receiver import KVReceiver
from epd_decode.model import DecodeLM


class DecodeStage:
    def __init__(self, cfg: EPDConfig, transfer: TransferEngine) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.backend = DecodeAttnBackend(cfg)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device)
            for _ in range(cfg.num_layers)
        ]
        self.model = DecodeLM(cfg, self.backend).to(cfg.device, torch.bfloat16)
        self.runner = DecodeGraphRunner(cfg, self.model, self.backend, self.kv_caches)
        self.receiver = KVReceiver(self.backend, transfer)
        self.requests: Dict[str, KVPageHandle] = {}
        self.seq_lens: Dict[str, int] = {}
        self.last_tokens: Dict[str, int] = {}
        self._next_offset = 0

    def accept_transfer(self, handle: KVPageHandle) -> None:
        for bs, w in self.backend.decode_wrappers.items():
            if w._kv_layout != handle.kv_layout:  # expect: FC103
                raise RuntimeError(f"prefill sent {handle.kv_layout} pages; decode bucket {bs} reads another layout")
        self.receiver.on_pages(handle, self._next_offset)
        self._next_offset += handle.page_ids.numel()
        self.requests[handle.request_id] = handle
        self.seq_lens[handle.request_id] = handle.seq_len
        self.last_tokens[handle.request_id] = handle.first_token

    def make_batch(self, req_ids: List[str]) -> DecodeBatch:
        lens = np.array([self.seq_lens[r] + 1 for r in req_ids], dtype=np.int32)
        ids = np.array([self.last_tokens[r] for r in req_ids], dtype=np.int64)
        base = lens.astype(np.int64) - 1 + np.array([self.requests[r].mrope_delta for r in req_ids], dtype=np.int64)
        pos = np.stack([base, base, base])
        indices = torch.cat([self.requests[r].page_ids for r in req_ids])
        return DecodeBatch(
            batch_size=len(req_ids),
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            mrope_positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(lens).to(self.device, non_blocking=True),
            seq_lens_cpu=lens,
            kv_indices=indices,
        )

    @torch.inference_mode()
    def step(self, req_ids: List[str]) -> torch.Tensor:
        fb = self.make_batch(req_ids)
        logits = self.runner.replay(fb)
        for r in req_ids:
            self.seq_lens[r] += 1
        return torch.argmax(logits, dim=-1)
