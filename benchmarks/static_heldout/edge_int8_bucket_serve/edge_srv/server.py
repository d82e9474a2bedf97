"""The edge server loop: prefill one prompt chunk at a time, otherwise decode every live slot through the graph of the
smallest bucket that holds the longest slot."""
import logging
from collections import deque
from typing import Deque, Dict, List, Tuple

import numpy as np
import torch

from edge.settings import EdgeSettings
from edge.runtime.attention import EdgeAttention
from edge.runtime.graphs import SeqBucketGraphs
from edge.runtime.kv import StaticKVPages
from edge.runtime.model import EdgeLM
from edge_srv.watchdog import Heartbeat, Watchdog

logger = logging.getLogger(__name__)


class EdgeServer:
    def __init__(self, settings: EdgeSettings, device: torch.device):
        self.settings = settings
        self.device = device
        self.kv = StaticKVPages(settings, device)
        self.attn = EdgeAttention(settings, self.kv, device)
        self.model = EdgeLM(settings, self.attn, self.kv).to(device)
        self.graphs = SeqBucketGraphs(settings, self.model, self.attn, self.kv, device)
        self.step_done = torch.cuda.Event()
        self.heartbeat = Heartbeat()
        self.watchdog = Watchdog(self, self.attn, settings.watchdog_timeout_s)
        self.out_host = torch.zeros(settings.max_batch, dtype=torch.int64, pin_memory=True)
        self.prompts: Deque[Tuple[int, List[int], int]] = deque()
        self.outputs: Dict[int, List[int]] = {}
        self.budget_np = np.zeros(settings.max_batch, dtype=np.int32)

    def start(self) -> None:
        self.graphs.capture_all()
        self.watchdog.start()

    def submit(self, prompt_ids: List[int], max_new_tokens: int) -> int:
        assert 1 <= len(prompt_ids) <= self.settings.max_prompt, "prompt length outside the edge limits"  # expect: FC109
        slot = self.kv.acquire()
        self.prompts.append((slot, list(prompt_ids), 0))
        self.outputs[slot] = []
        self.budget_np[slot] = max_new_tokens
        return slot

    def _prefill_step(self) -> None:
        slot, prompt, start = self.prompts.popleft()
        tokens = prompt[start : start + self.settings.prefill_chunk]
        chunk = self.attn.init_forward_metadata(slot, start, tokens)
        logits = self.model.prefill(chunk)
        self.kv.assign(slot, start + len(tokens))
        if start + len(tokens) < len(prompt):
            self.prompts.appendleft((slot, prompt, start + len(tokens)))
        else:
            self.out_host[:1].copy_(torch.argmax(logits, dim=-1), non_blocking=True)
            self.step_done.record()
            self.step_done.synchronize()
            self.outputs[slot].append(int(self.out_host[0]))

    def _decode_step(self) -> None:
        slots = sorted(self.kv.slots_in_use - {s for s, _, _ in self.prompts})
        if not slots:
            return
        lens_np = self.kv.slot_len_np[slots]
        i = self.graphs.bucket_index(int(lens_np.max()) + 1)
        ids_host = torch.tensor([self.outputs[s][-1] for s in slots], dtype=torch.int64).pin_memory()
        pos_host = torch.from_numpy(lens_np.astype(np.int64)).pin_memory()
        for s in slots:
            self.kv.assign(s, int(self.kv.slot_len_np[s]) + 1)
        logits = self.graphs.replay(i, slots, ids_host, pos_host)
        self.out_host[: len(slots)].copy_(torch.argmax(logits, dim=-1), non_blocking=True)
        self.step_done.record()
        self.step_done.synchronize()
        for row, s in enumerate(slots):
            self.outputs[s].append(int(self.out_host[row]))
            self.budget_np[s] -= 1
            if self.budget_np[s] <= 0:
                self.kv.release(s)

    def serve_forever(self) -> None:
        while True:
            if self.prompts:
                self._prefill_step()
            else:
                self._decode_step()
            self.heartbeat.beat()
