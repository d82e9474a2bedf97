"""Engine loop: requests arrive as dicts, events as (kind, payload) tuples; the step `match`es on both."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from attn.match_backend import MatchAttnBackend
from mdispatch import REQUEST_KINDS, DecodeBatch, EngineConfig, PrefillBatch, build_decode_batch, build_prefill_batch
from runtime.graph_runner import BucketGraphRunner

logger = logging.getLogger(__name__)


def _scrub_pages(indices: torch.Tensor, rows: torch.Tensor) -> None:  # a stale read must not reach a reused page
    indices[rows] = 0


class MatchEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device, num_pages: int, num_layers: int = 32):
        self.cfg, self.device = cfg, device
        self.backend = MatchAttnBackend(cfg, device)
        hidden, kv_dim = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden, device=device)
        self.qkv = [nn.Linear(hidden, hidden + 2 * kv_dim, bias=False, device=device) for _ in range(num_layers)]
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False, device=device)
        self._sm_scale = cfg.head_dim ** -0.5  # ok: FC103
        kv_shape = (2, num_pages * 16, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=device) for _ in self.qkv]
        self.graph_runner = BucketGraphRunner(cfg, self.forward_decode, self.backend, cfg.buckets)
        self.graph_max_len = cfg.max_context_len // 2
        self.waiting: List[Dict[str, Any]] = []
        self.running: Dict[int, Dict[str, Any]] = {}  # slot -> request
        self.events: List[Tuple[str, Any]] = []
        self.outbox: List[Tuple[str, Any]] = []
        self.temperature_buf: Optional[torch.Tensor] = None
        self.vocab_mask = torch.ones(cfg.vocab_size, dtype=torch.bool, device=device)
        self.next_ids = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.ids_host = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()

    def add_request(self, req: Dict[str, Any]) -> None:
        assert req.get("kind") in REQUEST_KINDS, f"unknown request kind {req.get('kind')!r}"  # expect: FC109
        self.waiting.append(req)

    def evict(self, rows: List[int]) -> None:  # KV manager: the pages behind these graph rows were reassigned
        self.events.append(("evict", list(rows)))

    def _qkv(self, proj: nn.Linear, h: torch.Tensor, slots: torch.Tensor, kv_cache: torch.Tensor):
        c = self.cfg
        q, k, v = proj(h).split([c.num_qo_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2, dim=-1)
        k, v = k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim)
        kv_cache[0].index_copy_(0, slots, k)
        kv_cache[1].index_copy_(0, slots, v)
        return q.view(-1, c.num_qo_heads, c.head_dim), k, v

    def forward_decode(self, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for proj, kv in zip(self.qkv, self.kv_caches):
            q, _, _ = self._qkv(proj, h, batch.slots, kv)
            h = h + self.backend.forward_decode(q, kv, batch).flatten(1)
        return self.lm_head(h)

    def forward_extend(self, batch: PrefillBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids)
        for proj, kv in zip(self.qkv, self.kv_caches):
            q, k, v = self._qkv(proj, h, batch.slots, kv)
            h = h + self.backend.forward_extend(q, k, v, kv, batch).flatten(1)
        return self.lm_head(h)

    def dispatch_requests(self) -> Optional[object]:
        prefill, decode = [], []
        while self.waiting:
            match self.waiting.pop(0):
                case {"kind": "abort", "slot": int(slot)}:
                    self._release(slot)
                case {"kind": "prefill", "new_tokens": [_, *_]} as req:
                    prefill.append(req)
                    self.running[req["slot"]] = req
                case {"kind": "decode", "logprobs": int(k), "slot": int(slot), **rest} if k > 0:
                    self.events.append(("logprobs", (len(decode), k)))
                    decode.append(rest | {"slot": slot})
                case {"kind": "decode", **rest} if rest.get("seq_len", 0) < self.cfg.max_context_len:
                    decode.append(rest)
                case other:
                    raise ValueError(f"malformed request {other!r}")
        if prefill:
            return build_prefill_batch(prefill, self.device)
        if decode:
            return build_decode_batch(decode, self.device, window=self.cfg.use_window,
                                      softcap=self.cfg.logit_cap > 0)
        return None

    def _release(self, slot: int) -> None:
        req = self.running.pop(slot, None)
        if req is not None and req.get("graph_rows"):
            rows = torch.tensor(req["graph_rows"], dtype=torch.int64, device=self.device)
            _scrub_pages(self.backend.kv_indices_buf, rows)  # expect: FC104

    def step(self) -> None:
        batch = self.dispatch_requests()
        match batch:
            case None:
                return
            case DecodeBatch(seq_lens=lens) if batch.batch_size <= self.cfg.buckets[-1] and int(lens.max()) <= self.graph_max_len:  # expect: FC101
                logits = self.graph_runner.replay(batch)
            case DecodeBatch():
                self.backend.init_forward_metadata(batch)
                logits = self.forward_decode(batch)
            case PrefillBatch(extend_lens=lens, qo_indptr_cpu=qo_cpu):
                num_tokens = int(qo_cpu[-1])  # ok: FC101
                logger.info(f"prefill of {num_tokens} tokens, extend lens {lens}")  # expect: FC101
                self.backend.init_forward_metadata(batch)
                logits = self.forward_extend(batch)[qo_cpu[1:] - 1]
        self._sample(batch, logits)
        self._drain_events(logits)

    def _sample(self, batch, logits: torch.Tensor) -> None:
        bs = logits.shape[0]
        temps = [r.get("temperature", 1.0) for r in self.running.values()][:bs]
        if self.temperature_buf is None:
            self.temperature_buf = torch.ones(self.cfg.max_batch_size, device=self.device)  # ok: FC107
        elif len(temps) == bs:
            self.temperature_buf = torch.tensor(temps, dtype=torch.float32, device=self.device)  # expect: FC107
        logits = torch.where(self.vocab_mask, logits, float("-inf"))  # ok: FC101
        assert self.temperature_buf is not None  # ok: FC109
        probs = torch.softmax(logits / self.temperature_buf[:bs, None], dim=-1)
        self.next_ids.resize_(bs)  # expect: FC107
        self.next_ids.copy_(torch.multinomial(probs, 1).view(-1))
        finished = self.next_ids == self.cfg.eos_token_id
        if finished.any():  # expect: FC101
            self.events.append(("finished", batch.slots[finished]))  # expect: FC101
        if self.ids_host.shape[0] < bs:
            self.ids_host = torch.empty(bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.ids_host[:bs].copy_(self.next_ids, non_blocking=True)  # ok: FC101
        self.copy_done.record()

    def _drain_events(self, logits: torch.Tensor) -> None:
        for event in self.events:
            match event:
                case ("evict", [*rows]):
                    self.backend.kv_indices_buf[rows] = 0  # expect: FC104
                case ("logprobs", (int(row), int(k))):
                    top = torch.log_softmax(logits[row], dim=-1).topk(k)
                    self.outbox.append(("logprobs", top.values.tolist()))  # expect: FC101
                case ("finished", slots):
                    self.outbox.append(("finished", slots))
                case (kind, _):
                    logger.debug("dropping event %s", kind)
        self.events.clear()
