"""Chat server: requests grouped by system prompt, decoded through graphs or the eager cascade."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import numpy as np
import torch

from sysprompt.attn.cascade_backend import ForwardBatch, PrefixGroup, SharedPrefixBackend
from sysprompt.config import PAGE_SIZE, ServerConfig
from sysprompt.model import SysPromptLM
from sysprompt.prefix_registry import PrefixRegistry, prompt_key
from sysprompt.runner.graph_runner import SysPromptGraphRunner

logger = logging.getLogger(__name__)


@dataclass
class ChatRequest:
    rid: str
    prompt_key: str
    prefix_slot: int
    prefix_tokens: int
    suffix_pages: List[int] = field(default_factory=list)
    suffix_len: int = 0
    last_token: int = 0
    output: List[int] = field(default_factory=list)


class ChatServer:
    COMPACT_EVERY = 512

    def __init__(self, cfg: ServerConfig, model_tag: str) -> None:
        self.cfg = cfg
        self.model_tag = model_tag
        self.device = torch.device(cfg.device)
        self.registry = PrefixRegistry(cfg)
        self.backend = SharedPrefixBackend(cfg, self.registry)
        self.model = SysPromptLM(cfg, self.backend).to(self.device)
        self.runner = SysPromptGraphRunner(cfg, self.model, self.backend)
        self.runner.capture()
        self.running: List[ChatRequest] = []
        # suffix pages live after the prefix region of the cache
        self.free_suffix_pages = list(range(cfg.max_prefix_pages, cfg.num_pages))
        self._steps = 0

    # ------------------------------------------------------------- admission
    def submit(self, rid: str, system_prompt: str, system_ids: Sequence[int], user_ids: Sequence[int]) -> None:
        key = prompt_key(system_prompt, self.model_tag)
        entry, needs_prefill = self.registry.acquire(key, len(system_ids))
        req = ChatRequest(rid=rid, prompt_key=key, prefix_slot=entry.slot, prefix_tokens=entry.num_tokens)
        req.suffix_len = len(user_ids)
        need = (req.suffix_len + PAGE_SIZE) // PAGE_SIZE
        req.suffix_pages = [self.free_suffix_pages.pop() for _ in range(need)]
        req.last_token = user_ids[-1]
        if needs_prefill:
            logger.info("new system prompt %s (%d tokens) in slot %d", key[:8], entry.num_tokens, entry.slot)
        self.running.append(req)

    def finish(self, req: ChatRequest) -> None:
        self.free_suffix_pages.extend(req.suffix_pages)
        self.registry.release(req.prompt_key)
        self.running.remove(req)

    # --------------------------------------------------------------- per step
    def _build_batch(self) -> ForwardBatch:
        self.running.sort(key=lambda r: r.prefix_slot)
        reqs = self.running
        bs = len(reqs)
        groups: List[PrefixGroup] = []
        for row, r in enumerate(reqs):
            if groups and groups[-1].slot == r.prefix_slot:
                groups[-1].num_rows += 1
            else:
                groups.append(PrefixGroup(slot=r.prefix_slot, first_row=row, num_rows=1))
        indptr = np.zeros(bs + 1, dtype=np.int32)
        indptr[1:] = np.cumsum([len(r.suffix_pages) for r in reqs])
        indices = np.fromiter((p for r in reqs for p in r.suffix_pages), dtype=np.int32, count=int(indptr[-1]))
        last = np.array([(r.suffix_len - 1) % PAGE_SIZE + 1 for r in reqs], dtype=np.int32)
        slots_cpu = torch.tensor([r.prefix_slot for r in reqs], dtype=torch.int64).pin_memory()
        prefix_lens_cpu = torch.tensor([r.prefix_tokens for r in reqs], dtype=torch.int32).pin_memory()
        seq_lens_cpu = torch.tensor([r.prefix_tokens + r.suffix_len for r in reqs], dtype=torch.int32)
        last_cpu = torch.from_numpy(last).pin_memory()
        dev = self.device
        return ForwardBatch(
            batch_size=bs,
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64).to(dev, non_blocking=True),
            positions=(seq_lens_cpu - 1).to(dev, non_blocking=True),
            prefix_slot=slots_cpu.to(dev, non_blocking=True),
            prefix_slot_cpu=slots_cpu,
            prefix_lens=prefix_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            suffix_kv_indptr_cpu=torch.from_numpy(indptr),
            suffix_kv_indices=torch.from_numpy(indices).to(dev, non_blocking=True),
            suffix_last_page_len_cpu=last_cpu,
            suffix_last_page_len=last_cpu.to(dev, non_blocking=True),
            groups=groups,
        )

    def step(self) -> None:
        if not self.running:
            return
        batch = self._build_batch()
        bs = self.runner.bucket(batch.batch_size)
        if bs is not None:
            logits = self.runner.replay(batch, bs)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_eager(batch.input_ids, batch.positions, batch)
        next_ids = logits.argmax(dim=-1).tolist()  # ok: FC101
        for r, tok in zip(self.running, next_ids):
            r.output.append(tok)
            r.last_token = tok
            r.suffix_len += 1
            if (r.suffix_len - 1) % PAGE_SIZE == 0:
                r.suffix_pages.append(self.free_suffix_pages.pop())
        self._steps += 1
        if self._steps % self.COMPACT_EVERY == 0:
            self.registry.compact()

    # ----------------------------------------------------------------- stats
    def memory_usage(self) -> Dict[str, int]:
        prefix_ws = self.backend.prefix_eager._float_workspace_buffer  # expect: FC103
        return {
            "prefix_workspace": prefix_ws.numel(),
            "cascade_workspace": self.backend.cascade_workspace.numel(),
            "kv_cache": sum(layer.kv_cache.numel() * layer.kv_cache.element_size() for layer in self.model.layers),
        }
