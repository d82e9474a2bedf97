"""The serving loop: one token-budgeted hybrid step at a time."""
from __future__ import annotations

import logging
from typing import Dict, List

import torch

import flashcheck
from sarathi.build.batch_builder import HybridBatchBuilder
from sarathi.config import ModelShape, SchedulerConfig
from sarathi.scheduler import ScheduledStep, TokenBudgetScheduler
from sarathi.sequence import Sequence
from sarathi_rt.attention import ChunkedAttentionBackend
from sarathi_rt.graph_runner import DecodeGraphRunner
from sarathi_rt.model import PiggybackDecoder
from sarathi_rt.sampler import Sampler

logger = logging.getLogger(__name__)


class SarathiEngine:
    def __init__(self, cfg: SchedulerConfig, shape: ModelShape, eos_id: int, device: str = "cuda"):
        self.cfg = cfg
        self.shape = shape
        self.eos_id = eos_id
        self.device = torch.device(device)
        self.scheduler = TokenBudgetScheduler(cfg, cfg.token_budget, cfg.chunk_size)
        self.builder = HybridBatchBuilder(cfg, self.device)
        self.backend = ChunkedAttentionBackend(cfg, shape, self.device)
        self.model = PiggybackDecoder(shape, self.backend).to(self.device, dtype=shape.dtype)
        self.model.allocate_kv(cfg.num_pages, cfg.page_size, self.device)
        self.graphs = DecodeGraphRunner(self.model, self.backend, self.builder, cfg, self.device)
        self.sampler = Sampler(shape.vocab_size, cfg.max_num_seqs, self.device)

        n = cfg.max_num_seqs
        self.temperatures_cpu = torch.ones(n, dtype=torch.float32, pin_memory=True)
        self.top_k_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.temperatures_gpu = torch.ones(n, dtype=torch.float32, device=self.device)
        self.top_k_gpu = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.tokens_pinned = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.copy_event = torch.cuda.Event()
        self.stats: Dict[str, int] = {"output_tokens": 0}
        self.step_id = 0
        self._started = False
        self._next_seq_id = 0

    def start(self) -> None:
        self.backend.warmup()
        self.graphs.capture_all()
        self._started = True

    def add_request(self, prompt_ids: List[int], max_new_tokens: int = 256, temperature: float = 1.0) -> int:
        if not prompt_ids:
            raise ValueError("empty prompt")
        seq = Sequence(self._next_seq_id, list(prompt_ids), max_new_tokens, temperature)
        self._next_seq_id += 1
        self.scheduler.add_request(seq)
        return seq.seq_id

    def _fill_sampling_params(self, sched: ScheduledStep) -> int:
        seqs = list(sched.decode_seqs) + [c.seq for c in sched.chunks]
        for row, seq in enumerate(seqs):
            self.temperatures_cpu[row] = seq.temperature
            self.top_k_cpu[row] = 0
        n = len(seqs)
        self.temperatures_gpu[:n].copy_(self.temperatures_cpu[:n], non_blocking=True)
        self.top_k_gpu[:n].copy_(self.top_k_cpu[:n], non_blocking=True)
        return n

    @flashcheck.hot_path
    def step(self) -> List[int]:
        assert self._started, "start() must run before step()"  # ok: FC109
        sched = self.scheduler.schedule()
        if sched.is_empty():
            return []
        batch = self.builder.build(sched.decode_seqs, sched.chunks)
        n = self._fill_sampling_params(sched)
        graph_bs = self.graphs.bucket_for(batch)
        self.backend.init_forward_metadata(batch, graph_bs)
        if graph_bs is not None:
            logits = self.graphs.replay(graph_bs, batch)
        elif self.graphs.has_hybrid(sched.num_tokens):
            logits = self.graphs.replay_hybrid(batch)
        elif batch.num_prefill_tokens == 0:
            logits = self.model.decode(batch.input_ids, batch)
        else:
            logits = self.model.forward_hybrid(batch.input_ids, batch)
        logger.debug("step %d chunk qo_indptr=%s", self.step_id, batch.chunk_qo_indptr_gpu)  # ok: FC101

        sampled = self.sampler.sample(logits, self.temperatures_gpu[:n], self.top_k_gpu[:n])
        # the detokenizer process reads this pinned copy once copy_event has fired
        self.tokens_pinned[:n].copy_(sampled, non_blocking=True)  # ok: FC101
        self.copy_event.record()
        if graph_bs is not None:
            # every decode row appended one token: bump the graph's last-page lengths for the next replay
            self.backend.last_page_len_buf[: batch.num_decodes].add_(1)  # expect: FC104
        next_tokens = sampled.tolist()  # expect: FC101
        self.stats["output_tokens"] += batch.num_sampled_rows
        finished = self.scheduler.commit(sched, next_tokens, self.eos_id)
        self.step_id += 1
        return [s.seq_id for s in finished]
