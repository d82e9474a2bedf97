"""The lookahead decoding loop: one verify forward per step accepts the longest matching n-gram per request."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np
import torch

import flashcheck
from ljserve.attention import LookaheadAttnBackend, PromptMetadata
from ljserve.config import LookaheadConfig
from ljserve.model import LookaheadLM, PagedKVPool
from ljserve.ngram.pool import NGramPool
from ljserve.ngram.window import JacobiWindow
from ljserve.runtime.graphs import LookaheadGraphRunner

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    greedy: bool = True
    output_ids: List[int] = field(default_factory=list)
    seq_len: int = 0
    row: int = -1

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return len(self.output_ids) >= self.max_new_tokens


class LookaheadEngine:
    def __init__(self, cfg: LookaheadConfig, num_pages: int, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.backend = LookaheadAttnBackend(cfg, device)
        self.kv_pool = PagedKVPool(cfg, num_pages, device)
        self.model = LookaheadLM(cfg, self.backend, self.kv_pool).to(device=device, dtype=torch.bfloat16)
        self.window = JacobiWindow(cfg, device)
        self.pool = NGramPool(cfg.ngram_size, cfg.pool_capacity, cfg.pool_per_key)
        self.runner = LookaheadGraphRunner(self.model, self.backend, cfg, device)
        self.verify_buf = torch.zeros((cfg.max_batch_size, cfg.max_verify, cfg.ngram_size), dtype=torch.int64, device=device)
        self._accept_buf: Optional[torch.Tensor] = None
        # column offsets of the T query rows: key token, window row w / column j, verify n-gram g / position j
        n1 = cfg.ngram_size - 1
        offs = [0]
        offs += [w + j + 1 for w in range(cfg.window_size) for j in range(n1)]
        offs += [j + 1 for _ in range(cfg.max_verify) for j in range(n1)]
        self._pos_offsets_cpu = torch.tensor(offs, dtype=torch.int64)
        self.free_rows = list(range(cfg.max_batch_size - 1, -1, -1))
        self.waiting: List[Request] = []
        self.running: List[Request] = []

    # ------------------------------------------------------------------ admission (between steps)
    def add_request(self, rid: int, prompt_ids: List[int], max_new_tokens: int, greedy: bool = True) -> None:
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_seq_len  # expect: FC109
        self.waiting.append(Request(rid, list(prompt_ids), max_new_tokens, greedy=greedy))

    def prefill_waiting(self) -> None:
        if not self.waiting or not self.free_rows:
            return
        admitted = []
        while self.waiting and self.free_rows:
            req = self.waiting.pop(0)
            req.row = self.free_rows.pop()
            admitted.append(req)
        lens = np.array([len(r.prompt_ids) for r in admitted], dtype=np.int32)
        for r in admitted:
            self.kv_pool.reserve(r.row, len(r.prompt_ids))
        locs = np.concatenate([self.kv_pool.slot_locs([r.row], np.zeros(1, dtype=np.int64), len(r.prompt_ids)) for r in admitted])
        ids = torch.tensor([t for r in admitted for t in r.prompt_ids], dtype=torch.int64).to(self.device, non_blocking=True)
        pos = torch.cat([torch.arange(n) for n in lens]).to(self.device, non_blocking=True)
        last_rows = torch.from_numpy(np.cumsum(lens) - 1).to(self.device, non_blocking=True)
        self.backend.plan_prompt(torch.from_numpy(lens))
        meta = PromptMetadata(
            qo_indptr_host=torch.from_numpy(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)),
            out_cache_loc=torch.from_numpy(locs).to(self.device, non_blocking=True),
            last_rows=last_rows,
        )
        logits = self.model.forward_prompt(ids, pos, meta)
        firsts = logits.argmax(dim=-1).tolist()  # ok: FC101
        for r, tok in zip(admitted, firsts):
            r.output_ids.append(tok)
            r.seq_len = len(r.prompt_ids)
            self.window.seed_row(len(self.running), torch.tensor(r.prompt_ids[-64:], dtype=torch.int64))
            self.running.append(r)

    # ------------------------------------------------------------------ one lookahead step
    def _assemble_inputs(self, batch: List[Request], bs: int) -> torch.Tensor:
        last_cpu = torch.tensor([r.last_token for r in batch], dtype=torch.int64)
        last = last_cpu.to(self.device, non_blocking=True)
        verify = self.verify_buf[:bs, :, 1:].reshape(bs, -1)
        return torch.cat([last[:, None], self.window.as_inputs(bs), verify], dim=1)

    def _positions(self, seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        pos_cpu = seq_lens_cpu.to(torch.int64)[:, None] + self._pos_offsets_cpu[None, :]
        return pos_cpu.to(self.device, non_blocking=True)

    @flashcheck.hot_path
    def step(self) -> List[Tuple[int, List[int]]]:
        batch = self.running
        bs = len(batch)
        if bs == 0:
            return []
        cfg = self.cfg
        G, N, T, L = cfg.max_verify, cfg.ngram_size, cfg.tokens_per_request, cfg.lookahead_len

        seq_lens_cpu = torch.tensor([r.seq_len for r in batch], dtype=torch.int32)
        rows = [r.row for r in batch]
        for r in batch:
            self.kv_pool.reserve(r.row, r.seq_len + T)
        locs = self.kv_pool.slot_locs(rows, seq_lens_cpu.numpy().astype(np.int64), T)
        sampling = [i for i, r in enumerate(batch) if not r.greedy]
        meta = self.backend.build_step_metadata(seq_lens_cpu, self.kv_pool.rows_table(rows), locs, sampling)

        cand_np = np.zeros((bs, G, N), dtype=np.int64)
        for i, r in enumerate(batch):
            cand_np[i] = self.pool.lookup(r.last_token, G)
        self.verify_buf[:bs].copy_(torch.from_numpy(cand_np), non_blocking=True)

        input_ids = self._assemble_inputs(batch, bs)
        positions = self._positions(seq_lens_cpu)
        if sampling:
            self.backend.plan_plain_decode(meta)
        if meta.bucket > 0 and meta.max_kv_len <= self.runner.max_graph_seq_len:
            logits = self.runner.replay(input_ids, positions, meta.seq_lens, meta)
        else:
            self.backend.plan_eager_verify(meta)
            logits = self.model.forward_lookahead(input_ids, positions, meta)

        # verification: candidate token j+1 is accepted while it equals the prediction at token j
        greedy_tok = logits.view(bs, T, -1).argmax(dim=-1)
        verify_pred = greedy_tok[:, 1 + L :].reshape(bs, G, N - 1)
        first_pred = greedy_tok[:, :1].unsqueeze(1).expand(bs, G, 1)
        preds = torch.cat([first_pred, verify_pred[:, :, :-1]], dim=-1)
        cand = self.verify_buf[:bs]
        hits = (cand[:, :, 1:] == preds).int()
        accept_len = hits.cumprod(dim=-1).sum(dim=-1)
        best_len, best_g = accept_len.max(dim=-1)
        ar = torch.arange(bs, device=self.device)
        tail = verify_pred[ar, best_g, (best_len - 1).clamp(min=0)]
        next_tok = torch.where(best_len > 0, tail, greedy_tok[:, 0])  # ok: FC101
        if self._accept_buf is None:
            self._accept_buf = torch.zeros((cfg.max_batch_size, G), dtype=torch.int64, device=self.device)  # ok: FC107
        self._accept_buf[:bs].copy_(accept_len)

        # Jacobi update: the window's last row takes the predictions made from the row before it
        new_row = greedy_tok[:, 1 : 1 + L].reshape(bs, cfg.window_size, N - 1)[:, -1, :].contiguous()
        self.window.shift(bs, new_row)

        host = torch.stack([best_len, best_g, next_tok], dim=1).tolist()  # expect: FC101
        outputs = []
        for i, (r, (k, g, bonus)) in enumerate(zip(batch, host)):
            new_tokens = cand_np[i, g, 1 : 1 + k].tolist() + [bonus]
            r.output_ids.extend(new_tokens)
            r.seq_len += len(new_tokens)
            hist = r.prompt_ids[-N:] + r.output_ids
            for j in range(max(0, len(hist) - N - len(new_tokens) + 1), len(hist) - N + 1):
                self.pool.insert(hist[j], np.asarray(hist[j + 1 : j + N], dtype=np.int64))
            outputs.append((r.rid, new_tokens))
        if any(k == N - 1 for k, _, _ in host):
            self.window.reseed(bs, preds[ar, best_g])

        # the verify graphs read the last-page lengths on the device: advance them for the next step
        lens_np = np.array([r.seq_len for r in batch], dtype=np.int32)
        last_np = ((lens_np + T - 1) % cfg.page_size + 1).astype(np.int32)
        self.backend.kv_last_page_len[:bs].copy_(torch.from_numpy(last_np), non_blocking=True)  # expect: FC104
        self._retire()
        return outputs

    def _retire(self) -> None:
        keep = [i for i, r in enumerate(self.running) if not r.finished]
        if len(keep) == len(self.running):
            return
        for r in self.running:
            if r.finished:
                self.kv_pool.release(r.row)
                self.free_rows.append(r.row)
        self.window.keep_rows(torch.tensor(keep, dtype=torch.int64).to(self.device, non_blocking=True))
        self.running = [self.running[i] for i in keep]

    def serve_forever(self, poll) -> None:
        self.runner.capture_all()
        while True:
            for rid, prompt, max_new, greedy in poll():
                self.add_request(rid, prompt, max_new, greedy)
            self.prefill_waiting()
            for rid, toks in self.step():
                logger.debug("request %d +%d tokens", rid, len(toks))
