"""Model runner: one attention plugin instance per layer type, eager steps or decode graph replays."""
from __future__ import annotations

import logging
import time
from typing import Dict, List, Sequence, Tuple

import torch

from peab.batch import Request, StepBatch, build_step_batch
from peab.config import LAYER_FULL, EngineConfig
from peab.registry import create_backend
from peab_plugins.base import AttentionBackend, KVCache
from peab_runtime.graph_runner import BucketGraphRunner
from peab_runtime.model import Model

logger = logging.getLogger(__name__)


def alloc_kv_caches(cfg: EngineConfig, device: torch.device) -> List[KVCache]:
    shape = (2, cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
    return [tuple(torch.zeros(shape, dtype=torch.bfloat16, device=device).unbind(0)) for _ in range(cfg.num_layers)]


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        assert set(cfg.layer_types()) <= set(cfg.layer_backends), "a layer type has no attention plugin"  # expect: FC109
        self.cfg, self.device = cfg, device
        self.backends: Dict[str, AttentionBackend] = {}
        for kind in sorted(set(cfg.layer_types())):
            self.backends[kind] = create_backend(cfg.layer_backends[kind], cfg, kind, device)
        self._backend = "+".join(f"{k}={cfg.layer_backends[k]}" for k in sorted(self.backends))  # ok: FC103
        self.model = Model(cfg, self.backends).to(device=device, dtype=torch.bfloat16)
        self.kv_caches = alloc_kv_caches(cfg, device)
        self.graph_runner = None
        if cfg.enable_cuda_graphs and self.backends[LAYER_FULL].supports_cuda_graph:
            self.graph_runner = BucketGraphRunner(self.model, self.backends, cfg, self.kv_caches, device)
        self.temperatures = torch.zeros(cfg.max_batch_size, dtype=torch.float32, device=device)
        self.logprobs_buf = torch.empty(cfg.max_batch_size, dtype=torch.float32, device=device)
        self.tokens_pinned = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.token_history = torch.empty(0, dtype=torch.int64, device=device)
        self.finished_len_sum = torch.zeros((), dtype=torch.int64, device=device)
        self.num_tokens_served = 0
        self.last_seq_lens: List[int] = []
        self.step_times: List[float] = []

    def execute_model(self, reqs: Sequence[Request]) -> Tuple[List[int], List[float]]:
        t0 = time.perf_counter()
        batch = build_step_batch(reqs, self.device)
        bs = batch.batch_size
        if batch.max_seq_len > self.cfg.max_model_len:
            raise ValueError(f"batch exceeds max_model_len={self.cfg.max_model_len}: {batch.seq_lens}")  # ok: FC101
        logger.debug(f"step [{self._backend}] bs={bs} seq_lens={batch.seq_lens}")  # expect: FC101
        if self.graph_runner is not None and self.graph_runner.can_run(batch):
            hidden = self.graph_runner.replay(batch)
        else:
            for backend in self.backends.values():
                backend.init_forward_metadata(batch)
            if batch.is_decode:  # ok: FC101
                hidden = self.model.forward_decode(batch.input_ids, batch.positions, batch.slot_ids, self.kv_caches)
            else:
                hidden = self.model.forward_extend(batch, self.kv_caches)
                hidden = hidden[batch.qo_indptr[1:].long() - 1]  # ok: FC101
        next_tokens, logprobs = self._sample(hidden, batch)
        finished = next_tokens == self.cfg.eos_token_id
        self.finished_len_sum.add_(batch.seq_lens[finished].sum())  # expect: FC101
        self.token_history = torch.cat([self.token_history, next_tokens])  # expect: FC107
        self.num_tokens_served += int(batch.qo_indptr[-1])  # expect: FC101
        self.last_seq_lens = batch.seq_lens_cpu.tolist()  # ok: FC101
        if self.tokens_pinned.numel() < bs:
            self.tokens_pinned = torch.empty(2 * bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.tokens_pinned[:bs].copy_(next_tokens, non_blocking=True)  # ok: FC101
        torch.cuda.synchronize()  # expect: FC101
        self.step_times.append(time.perf_counter() - t0)
        return self.tokens_pinned[:bs].tolist(), logprobs

    def _sample(self, hidden: torch.Tensor, batch: StepBatch) -> Tuple[torch.Tensor, List[float]]:
        assert self.model.lm_head.out_features == self.cfg.vocab_size  # ok: FC109
        bs = batch.batch_size
        logits = self.model.lm_head(hidden).float()
        if self.logprobs_buf.numel() < bs:
            self.logprobs_buf = torch.empty(bs, dtype=torch.float32, device=self.device)  # expect: FC107
        temps = self.temperatures[:bs]
        probs = torch.softmax(logits / temps.clamp(min=1e-5)[:, None], dim=-1)
        sampled = torch.multinomial(probs, 1).squeeze(1)
        next_tokens = torch.where(temps > 0, sampled, logits.argmax(dim=-1))  # ok: FC101
        torch.gather(torch.log_softmax(logits, dim=-1), 1, next_tokens[:, None], out=self.logprobs_buf[:bs, None])
        return next_tokens, self.logprobs_buf[:bs].tolist()  # expect: FC101

    def dump_state(self) -> Dict[str, object]:
        plugins = {k: b.describe() for k, b in self.backends.items()}
        return {"history": self.token_history.cpu(), "plugins": plugins}  # ok: FC101
