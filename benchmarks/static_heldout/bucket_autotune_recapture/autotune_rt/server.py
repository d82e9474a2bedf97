"""The serving loop: observe the batch size, maybe re-tune, replay or run eagerly, hand tokens off."""

import queue
import threading
from dataclasses import dataclass
from typing import Callable, List

import numpy as np
import torch

from autotune.config import AutotuneConfig
from autotune.histogram import TrafficHistogram
from autotune_rt.attention import BucketAttention, ChunkSpec
from autotune_rt.model import BucketDecoder
from autotune_rt.recapture import Recapturer


@dataclass
class ServeBatch:
    input_ids: torch.Tensor
    n_pages_np: np.ndarray
    last_np: np.ndarray
    page_ids_np: np.ndarray
    chunk: ChunkSpec

    @property
    def size(self) -> int:
        return int(self.n_pages_np.shape[0])


def dummy_chunk(cfg: AutotuneConfig, device: torch.device) -> ChunkSpec:
    pages = -(-cfg.chunk_tokens // cfg.page_size)
    return ChunkSpec(
        qo_indptr_host=torch.tensor([0, cfg.chunk_tokens], dtype=torch.int32),
        kv_indptr_host=torch.tensor([0, pages], dtype=torch.int32),
        kv_indices=torch.zeros(pages, dtype=torch.int32, device=device),
        last_page_len_host=torch.tensor([(cfg.chunk_tokens - 1) % cfg.page_size + 1], dtype=torch.int32),
    )


class AutotuneServer:
    def __init__(self, cfg: AutotuneConfig, emit: Callable[[List[int], List[float]], None]):
        self.cfg = cfg
        self.emit = emit
        self.device = torch.device("cuda")
        kv_shape = (cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(kv_shape, dtype=torch.bfloat16, device=self.device)
        self.attn = BucketAttention(cfg, self.device)
        self.model = BucketDecoder(cfg, self.attn, self.kv_cache).to(self.device)
        self.hist = TrafficHistogram(cfg.max_batch)
        self.recap = Recapturer(cfg, self.model, self.attn, self.hist, dummy_chunk(cfg, self.device), self.device)
        self.next_tokens_host = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.logprobs_host = torch.zeros(cfg.max_batch, dtype=torch.float32, pin_memory=True)
        self.done_event = torch.cuda.Event()
        self.hist_dev = None
        self.out_queue: "queue.Queue" = queue.Queue()
        self.output_thread = threading.Thread(target=self.output_loop, daemon=True)

    def start(self) -> None:
        self.recap.record_all()
        self.output_thread.start()

    def step(self, batch: ServeBatch) -> None:
        n = batch.size
        self.hist.observe(n)
        self.hist_dev = torch.zeros(self.cfg.max_batch + 1, dtype=torch.int64, device=self.device) if self.hist_dev is None else self.hist_dev  # ok: FC107
        self.hist_dev[n] += 1
        self.recap.maybe_retune()
        bs = self.recap.bucket_for(n)
        if bs == 0:
            self.attn.plan_eager(n, batch.n_pages_np, batch.last_np, batch.page_ids_np)
            logits = self.model.forward_eager(batch.input_ids)
        else:
            self.attn.prepare_replay(bs, batch.n_pages_np, batch.last_np, batch.page_ids_np, batch.chunk)
            self.recap.static_input_ids[:n].copy_(batch.input_ids)
            logits = self.recap.replay_bucket(bs, n)
        logp = torch.log_softmax(logits.float(), dim=-1)
        next_tokens = logits.argmax(dim=-1)
        self.next_tokens_host[:n].copy_(next_tokens)  # expect: FC101
        self.logprobs_host[:n].copy_(logp.gather(-1, next_tokens[:, None]).squeeze(-1), non_blocking=True)  # ok: FC101
        self.done_event.record()
        self.out_queue.put((n, self.done_event))

    def output_loop(self) -> None:
        while True:
            n, ev = self.out_queue.get()
            ev.synchronize()
            self.emit(self.next_tokens_host[:n].tolist(), self.logprobs_host[:n].tolist())
