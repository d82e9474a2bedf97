"""The rollout engine: generate() for the trainer, sleep / wake-up / weight update between rollouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
from flashinfer.sampling import sampling_from_probs

from rollout.attn import RolloutDecodeBackend
from rollout.config import RolloutConfig
from rollout.graphs import RolloutGraphRunner
from rollout.model import PolicyModel


@dataclass
class Rollout:
    rid: int
    prompt: List[int]
    response: List[int] = field(default_factory=list)
    slot: int = -1
    pages: List[int] = field(default_factory=list)
    done: bool = False

    @property
    def seq_len(self) -> int:
        return len(self.prompt) + len(self.response)


class RolloutBatch:
    """The decode inputs of one step, built fresh every step."""

    def __init__(self, rollouts: List[Rollout], page_table_np: np.ndarray, page_size: int, device) -> None:
        lens = np.array([r.seq_len for r in rollouts], dtype=np.int32)
        pos = (lens - 1).astype(np.int64)
        slots = np.array([r.slot for r in rollouts], dtype=np.int64)
        self.batch_size = len(rollouts)
        self.rids = [r.rid for r in rollouts]
        self.page_table_np = page_table_np[slots]
        self.seq_lens_cpu = torch.from_numpy(lens)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)  # ok: FC107
        last_tokens = [r.response[-1] if r.response else r.prompt[-1] for r in rollouts]
        self.input_ids = torch.tensor(last_tokens, dtype=torch.int64, device=device)
        self.positions = torch.from_numpy(pos).to(device, non_blocking=True)
        loc = page_table_np[slots, pos // page_size].astype(np.int64) * page_size + pos % page_size
        self.out_cache_loc = torch.from_numpy(loc).to(device, non_blocking=True)


class RolloutEngine:
    def __init__(self, cfg: RolloutConfig, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.backend = RolloutDecodeBackend(cfg, self.device)
        self.model = PolicyModel(cfg, self.backend).to(self.device, dtype=torch.bfloat16)
        self.kv_cache = self._alloc_kv()
        self.graph_runner = RolloutGraphRunner(self.model, self.backend, cfg, self.device)
        self.page_table_np = np.zeros((cfg.max_running, cfg.max_pages_per_req), dtype=np.int32)
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))
        self.free_slots = list(range(cfg.max_running - 1, -1, -1))
        self.running: Dict[int, Rollout] = {}
        self.tokens_cpu = torch.zeros(cfg.max_running, dtype=torch.int64, pin_memory=True)
        self.step_done = torch.cuda.Event()
        self.max_total_len = cfg.max_prompt_len + cfg.max_response_len
        self.weight_version = 0
        self.asleep = False
        self._host_weights: Dict[str, torch.Tensor] = {}
        self._finished: List[int] = []

    def _alloc_kv(self) -> torch.Tensor:
        c = self.cfg
        shape = (c.num_layers, c.num_pages, 2, c.page_size, c.num_kv_heads, c.head_dim)
        return torch.zeros(shape, dtype=torch.bfloat16, device=self.device)

    # ------------------------------------------------------------------ between rollouts
    def sleep(self) -> None:
        """Hand the GPU to the trainer: offload weights, drop the KV cache, workspaces and graphs."""
        for name, p in self.model.named_parameters():
            self._host_weights[name] = p.data.cpu()  # ok: FC101
            p.data = torch.empty(0, dtype=p.dtype, device=self.device)
        self.kv_cache = None
        self.backend.sleep()
        self.graph_runner.release()
        torch.cuda.empty_cache()
        self.asleep = True

    def wake_up(self) -> None:
        for name, p in self.model.named_parameters():
            p.data = self._host_weights.pop(name).to(self.device, non_blocking=True)
        self.kv_cache = self._alloc_kv()
        self.backend.wake_up()
        self.graph_runner.init_graph_inputs()
        self.graph_runner.recapture(self.kv_cache)
        self.asleep = False

    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]], version: int) -> None:
        """Load the trainer's resharded weights (already gathered to this rank's TP shard)."""
        assert version > self.weight_version, "stale weight update"  # expect: FC109
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            # resharded tensors arrive as fresh buffers; rebinding avoids a second copy of every bucket
            params[name].data = tensor.to(self.device, non_blocking=True)
        self.weight_version = version
        # the captured graphs read the old parameter addresses: capture again
        self.graph_runner.recapture(self.kv_cache)

    # ------------------------------------------------------------------ the rollout loop
    def generate(self, prompts: List[List[int]], max_new_tokens: int) -> List[List[int]]:
        if self.asleep:
            self.wake_up()
        rollouts = [Rollout(i, list(p)) for i, p in enumerate(prompts)]
        for r in rollouts:
            self._admit(r)
        self._prefill(rollouts)
        for _ in range(max_new_tokens):
            if not self.running:
                break
            order = list(self.running.values())
            self.decode_step()
            self.step_done.synchronize()
            for r, tok in zip(order, self.tokens_cpu[: len(order)].tolist()):
                r.response.append(tok)
            for rid in self._finished:
                self._retire(self.running[rid])
            self._finished.clear()
        return [r.response for r in rollouts]

    def decode_step(self) -> None:
        rollouts = list(self.running.values())
        for r in rollouts:
            if (r.seq_len - 1) // self.cfg.page_size >= len(r.pages):
                self.page_table_np[r.slot, len(r.pages)] = self.free_pages.pop()
                r.pages.append(int(self.page_table_np[r.slot, len(r.pages)]))
        batch = RolloutBatch(rollouts, self.page_table_np, self.cfg.page_size, self.device)
        bs = batch.batch_size
        self.graph_runner.temps = torch.full((bs,), self.cfg.temperature, device=self.device)  # expect: FC107
        if bs <= self.cfg.capture_bs[-1]:
            logits = self.graph_runner.replay(batch)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.decode(batch.input_ids, batch.positions, batch.out_cache_loc, self.kv_cache)
            logits = logits / self.cfg.temperature
        next_ids = sampling_from_probs(torch.softmax(logits, dim=-1))
        self.tokens_cpu[:bs].copy_(next_ids, non_blocking=True)  # ok: FC101
        self.step_done.record()
        finished = (next_ids == self.cfg.eos_token_id) | (batch.seq_lens + 1 >= self.max_total_len)
        if finished.any():  # expect: FC101
            for row in finished.nonzero().flatten().tolist():  # expect: FC101
                self._finished.append(batch.rids[row])

    # ------------------------------------------------------------------ pages
    def _admit(self, r: Rollout) -> None:
        r.slot = self.free_slots.pop()
        for i in range(-(-len(r.prompt) // self.cfg.page_size)):
            r.pages.append(self.free_pages.pop())
            self.page_table_np[r.slot, i] = r.pages[-1]
        self.running[r.rid] = r

    def _retire(self, r: Rollout) -> None:
        r.done = True
        self.free_pages.extend(r.pages)
        self.free_slots.append(r.slot)
        del self.running[r.rid]

    def _prefill(self, rollouts: List[Rollout]) -> None:
        ps = self.cfg.page_size
        lens = np.array([len(r.prompt) for r in rollouts], dtype=np.int32)
        qo_indptr_cpu = torch.zeros(len(rollouts) + 1, dtype=torch.int32)
        qo_indptr_cpu[1:] = torch.from_numpy(np.cumsum(lens))
        n_pages = (lens + ps - 1) // ps
        kv_indptr_cpu = torch.zeros(len(rollouts) + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.from_numpy(np.cumsum(n_pages))
        flat = np.concatenate([self.page_table_np[r.slot, :n] for r, n in zip(rollouts, n_pages)])
        self.backend.kv_indices[: flat.size].copy_(torch.from_numpy(flat), non_blocking=True)
        self.backend.kv_last_page_len_cpu[: len(rollouts)] = torch.from_numpy(lens - (n_pages - 1) * ps)
        self.backend.plan_prefill(qo_indptr_cpu, kv_indptr_cpu, flat.size, len(rollouts))
        pos = np.concatenate([np.arange(n) for n in lens])
        owner = np.repeat([r.slot for r in rollouts], lens)
        loc = self.page_table_np[owner, pos // ps].astype(np.int64) * ps + pos % ps
        ids = torch.tensor([t for r in rollouts for t in r.prompt], device=self.device)
        last = torch.from_numpy(np.cumsum(lens) - 1).to(self.device)
        logits = self.model.prefill(
            ids, torch.from_numpy(pos).to(self.device), torch.from_numpy(loc).to(self.device), self.kv_cache, last
        )
        first = sampling_from_probs(torch.softmax(logits, dim=-1))
        for r, tok in zip(rollouts, first.tolist()):
            r.response.append(tok)
