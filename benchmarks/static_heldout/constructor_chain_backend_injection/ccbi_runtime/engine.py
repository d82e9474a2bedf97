"""Top of the constructor chain: the engine picks the attention backend, the executor hands it to its worker."""

from __future__ import annotations

from typing import Dict, List

import torch

import ccbi_attn.flashinfer_backend  # noqa: F401  (registers the FlashInfer backends)
import ccbi_attn.mla_backend  # noqa: F401
import ccbi_attn.workspace as ws_mod
from ccbi.config import EngineConfig
from ccbi.forward_batch import SchedBatch
from ccbi_attn.base import AttentionBackend
from ccbi_runtime.worker import Worker


class Executor:
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend, device: torch.device):
        assert backend is not None, "the executor needs an attention backend"  # expect: FC109
        self.cfg, self.backend = cfg, backend
        self.worker = Worker(cfg, self.backend, device)

    def execute_model(self, batch: SchedBatch):
        return self.worker.execute_model(batch)

    def abort(self, slots: List[int]) -> None:
        self.worker.model_runner.release(torch.tensor(slots, dtype=torch.int64))


class LLMEngine:
    def __init__(self, cfg: EngineConfig, device: str = "cuda:0"):
        assert cfg.attention_backend in AttentionBackend.registry, cfg.attention_backend  # expect: FC109
        self.cfg, self.device = cfg, torch.device(device)
        ws_mod.configure_workspace(cfg)
        shared_ws = torch.empty(ws_mod.SHARED_WS_BYTES, dtype=torch.uint8, device=self.device)  # ok: FC106
        shared_ws.zero_()
        self.attn_backend = AttentionBackend.create(cfg, self.device, shared_ws)
        self.executor = Executor(cfg, self.attn_backend, self.device)
        self.outputs: Dict[int, List[int]] = {}

    def step(self, batch: SchedBatch) -> Dict[int, List[int]]:
        next_ids, done = self.executor.execute_model(batch)
        done.synchronize()  # ok: FC101
        for rid, tok in zip(batch.req_ids.tolist(), next_ids.tolist()):  # ok: FC101
            self.outputs.setdefault(rid, []).append(tok)
        return self.outputs

    def abort_requests(self, slots: List[int]) -> None:
        self.executor.abort(slots)
        self.attn_backend.reset_padding()
