"""Chunked-prefill engine that returns prompt logprobs per request."""

from typing import Dict, List, Optional

import numpy as np
import torch

from plp import ChunkPlan, LogprobConfig, LogprobRequest, PromptLogprobCollector
from plp_exec.backend import ChunkedAttentionBackend
from plp_exec.detok import DetokenizerThread
from plp_exec.graph_runner import DecodeGraphRunner
from plp_exec.metadata import ChunkMetadataBuilder
from plp_exec.model import ChunkedLM


class LogprobEngine:
    def __init__(self, cfg: LogprobConfig, device: torch.device, tokenizer):
        self.cfg = cfg
        self.device = device
        self.backend = ChunkedAttentionBackend(cfg, device)
        self.backend.init_graph_buffers()
        self.builder = ChunkMetadataBuilder(cfg, device)
        self.collector = PromptLogprobCollector(cfg, device)
        self.model = ChunkedLM(cfg, self.backend, device)
        self.runner = DecodeGraphRunner(self.model, self.backend, cfg, device)
        self.requests: Dict[int, LogprobRequest] = {}
        self.detok = DetokenizerThread(tokenizer, self.collector, self.requests)
        self.detok.start()
        self.waiting: List[int] = []
        self.running: List[int] = []
        self.free_pages: List[int] = list(range(cfg.max_pages))
        self.next_page_slot = 0
        self.tokens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.ids_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.ids_np = self.ids_pinned.numpy()
        self.token_event = torch.cuda.Event()

    def add_request(self, req_id: int, prompt_ids: np.ndarray, top_k: int) -> None:
        self.collector.register(req_id, prompt_ids, top_k)
        self.requests[req_id] = LogprobRequest(req_id=req_id, prompt_ids=prompt_ids, top_k=top_k)
        self.waiting.append(req_id)

    def _alloc(self, req: LogprobRequest, new_len: int) -> None:
        ps = self.cfg.page_size
        need = (new_len + ps - 1) // ps - len(req.pages)
        req.pages.extend(self.free_pages.pop() for _ in range(max(need, 0)))

    def _page_table(self, rids: List[int]) -> np.ndarray:
        table = np.zeros((len(rids), self.cfg.max_pages_per_seq), dtype=np.int32)
        for i, rid in enumerate(rids):
            pages = self.requests[rid].pages
            table[i, : len(pages)] = pages
        return table

    def _schedule_chunk(self) -> Optional[ChunkPlan]:
        budget = self.cfg.chunk_size
        rids, ids, pos, ext, pre, tgt, fin = [], [], [], [], [], [], []
        for rid in list(self.waiting):
            if budget == 0:
                break
            req = self.requests[rid]
            n = min(req.remaining, budget)
            s = req.num_computed
            self._alloc(req, s + n)
            rids.append(rid)
            ids.append(req.prompt_ids[s : s + n])
            pos.append(np.arange(s, s + n))
            nxt = np.full(n, -1, dtype=np.int64)
            m = min(n, len(req.prompt_ids) - s - 1)
            nxt[:m] = req.prompt_ids[s + 1 : s + 1 + m]
            tgt.append(nxt)
            ext.append(n)
            pre.append(s)
            fin.append(s + n == len(req.prompt_ids))
            budget -= n
        if not rids:
            return None
        return ChunkPlan(
            req_ids=rids,
            input_ids_np=np.concatenate(ids).astype(np.int64),
            positions_np=np.concatenate(pos).astype(np.int64),
            extend_lens_np=np.asarray(ext, dtype=np.int64),
            prefix_lens_np=np.asarray(pre, dtype=np.int64),
            page_table_np=self._page_table(rids),
            target_ids_np=np.concatenate(tgt),
            finishes_prompt=fin,
        )

    def step(self) -> None:
        plan = self._schedule_chunk()
        if plan is not None:
            self._prefill_chunk(plan)
        if self.running:
            self._decode()

    def _prefill_chunk(self, plan: ChunkPlan) -> None:
        meta = self.builder.build(plan)
        self.backend.init_forward_metadata(meta)
        ids = torch.from_numpy(plan.input_ids_np).to(self.device, non_blocking=True)
        logits = self.model.forward_extend(ids)
        self.collector.collect_chunk(logits, meta)
        ranks = meta.ranks_out
        for rid, (a, b) in meta.row_spans.items():
            self.requests[rid].prompt_ranks.extend([int(r) for r in ranks[a:b]])  # expect: FC101
        event, n = self.collector.handoff()
        self.detok.submit_logprobs(event, n, meta.row_spans)
        for i, rid in enumerate(plan.req_ids):
            req = self.requests[rid]
            req.num_computed += int(plan.extend_lens_np[i])
            if plan.finishes_prompt[i]:
                self.waiting.remove(rid)
                self._stage_decode_pages(rid)
                self.running.append(rid)

    def _stage_decode_pages(self, rid: int) -> None:
        # copy the finished prompt's pages where the first decode step will look for them
        req = self.requests[rid]
        pages = torch.as_tensor(req.pages, dtype=torch.int32).to(self.device, non_blocking=True)
        off = self.next_page_slot
        self.backend.bufs.kv_indices[off : off + len(req.pages)].copy_(pages)  # expect: FC104
        self.next_page_slot = off + len(req.pages)

    def _decode(self) -> None:
        rids = self.running[: self.cfg.max_batch]
        real = len(rids)
        bs = next(b for b in sorted(self.cfg.decode_buckets) if b >= real)
        for i, rid in enumerate(rids):
            req = self.requests[rid]
            self._alloc(req, req.seq_len + 1)
            self.ids_np[i] = req.output_ids[-1] if req.output_ids else int(req.prompt_ids[-1])
        seq_lens_np = np.asarray([self.requests[r].seq_len + 1 for r in rids], dtype=np.int64)
        ids = self.ids_pinned[:real].to(self.device, non_blocking=True)
        logits = self.runner.replay(bs, real, ids, seq_lens_np, self._page_table(rids))
        next_ids = torch.argmax(logits, dim=-1)
        self.tokens_pinned[:real].copy_(next_ids, non_blocking=True)
        self.token_event.record()
        self.detok.submit_tokens(self.token_event, self.tokens_pinned, rids)
