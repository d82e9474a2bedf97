"""The agent server's step loop.

Each step decodes one token for every running request.  A request whose token
closes a tool call leaves the batch and is parked; its tool runs in a thread
pool; when the result arrives the request is resumed by a paged prefill of the
tool output over its parked pages, and rejoins the decode batch once the first
token after the tool output is known on the host.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from agentsrv.requests import AgentRequest, ReqState
from agentsrv.settings import AgentSettings
from agentsrv_core.attention import AgentAttention
from agentsrv_core.graphs import DecodeGraphs, DecodeStepInputs
from agentsrv_core.model import AgentLM
from agentsrv_core.parking import ParkingLot
from agentsrv_core.tools.detector import ToolCallDetector
from agentsrv_core.tools.registry import ToolRegistry


class AgentLoop:
    def __init__(self, settings: AgentSettings, tokenizer, device: str = "cuda"):
        s = settings
        self.s = s
        self.device = torch.device(device)
        self.tokenizer = tokenizer
        self.kv_cache = [
            torch.zeros((s.num_pages, 2, s.page_size, s.num_kv_heads, s.head_dim), dtype=torch.bfloat16, device=self.device)
            for _ in range(s.num_layers)
        ]
        self.attn = AgentAttention(s, self.kv_cache, self.device)
        self.model = AgentLM(s, self.attn).to(self.device)
        self.graphs = DecodeGraphs(self.model, self.attn, s)
        self.parking = ParkingLot(s, self.attn, self.kv_cache)
        self.detector = ToolCallDetector(s)
        self.tools = ToolRegistry(s.tool_call_start_id, s.tool_call_end_id, tokenizer.decode)
        self.free_pages: List[int] = list(range(s.num_pages - 1, -1, -1))
        self.requests: Dict[str, AgentRequest] = {}
        self.running: List[AgentRequest] = []
        self.rejoin: "queue.Queue[AgentRequest]" = queue.Queue()
        self.resume_ready: "queue.Queue[Tuple[str, str]]" = queue.Queue()
        self.executor = ThreadPoolExecutor(max_workers=8)
        self.lock = threading.Lock()

        max_bs = s.max_batch_size
        self.sampled = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.stop_flags = torch.zeros(max_bs, dtype=torch.bool, device=self.device)
        self.token_history_gpu = torch.zeros((max_bs, s.history_window), dtype=torch.int64, device=self.device)
        self.sampled_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.resume_first = torch.zeros(s.max_resume_batch, dtype=torch.int64, device=self.device)
        self.resume_first_host = torch.zeros(s.max_resume_batch, dtype=torch.int64, pin_memory=True)
        self.stop_host = np.zeros(max_bs, dtype=bool)
        self.last_rids: List[str] = []
        self.retire_pending = False
        self.copy_done = torch.cuda.Event()
        self.resume_done = torch.cuda.Event()

    # --------------------------------------------------------------- helpers
    def _alloc(self, n: int) -> List[int]:
        if n > len(self.free_pages):
            raise MemoryError(f"need {n} KV pages, {len(self.free_pages)} free")
        return [self.free_pages.pop() for _ in range(n)]

    def _ensure_pages(self, req: AgentRequest, extra_tokens: int) -> None:
        need = (req.seq_len + extra_tokens + self.s.page_size - 1) // self.s.page_size
        if need > len(req.pages):
            req.pages.extend(self._alloc(need - len(req.pages)))

    def _slot(self, req: AgentRequest, pos: int) -> int:
        return req.pages[pos // self.s.page_size] * self.s.page_size + pos % self.s.page_size

    def _decode_inputs(self, reqs: Sequence[AgentRequest]) -> DecodeStepInputs:
        ids = torch.tensor([r.last_token for r in reqs], dtype=torch.int64)
        pos = torch.tensor([r.seq_len for r in reqs], dtype=torch.int64)
        slots = torch.tensor([self._slot(r, r.seq_len) for r in reqs], dtype=torch.int64)
        return DecodeStepInputs(
            ids.to(self.device, non_blocking=True),
            pos.to(self.device, non_blocking=True),
            slots.to(self.device, non_blocking=True),
        )

    # ------------------------------------------------------------------ step
    def step(self) -> int:
        now = time.monotonic()
        self._retire_finished()
        while not self.rejoin.empty():
            self.running.append(self.rejoin.get_nowait())
        self._resume_ready_requests()
        reqs = list(self.running)
        raw_bs = len(reqs)
        if raw_bs == 0:
            self.parking.offload_idle(now)
            return 0
        for r in reqs:
            self._ensure_pages(r, 1)
        inputs = self._decode_inputs(reqs)
        if raw_bs <= self.graphs.max_bs:
            logits = self.graphs.replay(reqs, inputs)
        else:
            self.attn.prepare_decode(reqs, raw_bs)
            logits = self.model.forward_decode(inputs.input_ids, inputs.positions, inputs.slot_mapping, raw_bs)

        sampled = self.sampled[:raw_bs]
        torch.argmax(logits, dim=-1, out=sampled)
        if sampled.shape[0] != raw_bs:
            raise RuntimeError(f"sampler returned {sampled} for {raw_bs} rows")  # ok: FC101
        hist = self.token_history_gpu[:raw_bs]
        hist.copy_(torch.roll(hist, shifts=-1, dims=1))
        hist[:, -1] = sampled
        torch.eq(sampled, self.s.eos_id, out=self.stop_flags[:raw_bs])
        call_rows = self.detector.scan(sampled)
        if self.stop_flags[:raw_bs].any():  # expect: FC101
            self.retire_pending = True
        for row in call_rows:
            self._pause_for_tool(reqs[row], row)

        self.last_rids = [r.rid for r in reqs]
        self.sampled_host[:raw_bs].copy_(sampled, non_blocking=True)
        self.copy_done.record()
        self.executor.submit(self._stream_tokens, list(self.last_rids), raw_bs, self.copy_done)
        self.parking.offload_idle(now)
        return raw_bs

    def _retire_finished(self) -> None:
        if not self.retire_pending:
            return
        with self.lock:
            stop_np = self.stop_host[: len(self.last_rids)].copy()
        for row in np.flatnonzero(stop_np):  # ok: FC101
            req = self.requests.pop(self.last_rids[row], None)
            if req is not None and req in self.running:
                self.running.remove(req)
                self.free_pages.extend(req.pages)
                req.state = ReqState.FINISHED
        self.retire_pending = False

    def _pause_for_tool(self, req: AgentRequest, row: int) -> None:
        self.running.remove(req)
        self.parking.park(req, row)
        self.executor.submit(self._run_tool, req)

    def _run_tool(self, req: AgentRequest) -> None:
        call = self.tools.parse(req.output_ids)
        req.pending_tool = call
        self.resume_ready.put((req.rid, self.tools.run(call)))

    def _resume_ready_requests(self) -> None:
        ready: List[AgentRequest] = []
        while len(ready) < self.s.max_resume_batch and not self.resume_ready.empty():
            rid, text = self.resume_ready.get_nowait()
            req = self.parking.unpark(rid, self._alloc)
            ids_cpu = self.tokenizer(text, return_tensors="pt").input_ids[0]
            req.tool_output_ids = ids_cpu.tolist()  # ok: FC101
            self._ensure_pages(req, len(req.tool_output_ids))
            ready.append(req)
        if not ready:
            return
        ids: List[int] = []
        pos: List[int] = []
        slots: List[int] = []
        last_rows: List[int] = []
        for r in ready:
            for j, tok in enumerate(r.tool_output_ids):
                ids.append(tok)
                pos.append(r.seq_len + j)
                slots.append(self._slot(r, r.seq_len + j))
            last_rows.append(len(ids) - 1)
            r.output_ids.extend(r.tool_output_ids)
        self.attn.prepare_resume(ready)
        logits = self.model.forward_resume(
            torch.tensor(ids, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor(pos, dtype=torch.int64).to(self.device, non_blocking=True),
            torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True),
            len(ready),
            torch.tensor(last_rows, dtype=torch.int64).to(self.device, non_blocking=True),
        )
        n = len(ready)
        torch.argmax(logits, dim=-1, out=self.resume_first[:n])
        self.resume_first_host[:n].copy_(self.resume_first[:n], non_blocking=True)
        self.resume_done.record()
        self.executor.submit(self._rejoin_resumed, ready, self.resume_done)

    # -------------------------------------------------------- output threads
    def _stream_tokens(self, rids: List[str], n: int, event: torch.cuda.Event) -> None:
        event.synchronize()
        toks = self.sampled_host[:n].tolist()
        with self.lock:
            for i, (rid, tok) in enumerate(zip(rids, toks)):
                self.stop_host[i] = tok == self.s.eos_id
                req = self.requests.get(rid)
                if req is not None:
                    req.output_ids.append(tok)

    def _rejoin_resumed(self, reqs: List[AgentRequest], event: torch.cuda.Event) -> None:
        event.synchronize()
        firsts = self.resume_first_host[: len(reqs)].tolist()
        for req, tok in zip(reqs, firsts):
            req.output_ids.append(tok)
            req.tool_output_ids = []
            req.state = ReqState.RUNNING
            self.rejoin.put(req)

    # ----------------------------------------------------------------- debug
    def replay_transcript(self, row: int, n: int) -> List[int]:
        """Debug endpoint: the last ``n`` tokens decode row ``row`` produced."""
        return self.token_history_gpu[row, -n:].tolist()  # ok: FC101
