"""Stage 1 of the pipeline: prepare and launch step N+1 while the worker post-processes step N."""

import logging
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

import flashcheck
from asyncpipe.config import PipelineConfig
from asyncpipe.detok import IncrementalDetokenizer, StopCriteria
from asyncpipe.pinned import PinnedOutputRing
from asyncpipe.postprocess import OutputProcessor, RequestState, StepRecord
from asyncpipe.queue import BoundedStepQueue
from pipe_exec.attention import DecodeMetadata, FlashInferPipelineBackend, PagedKVPool, PrefillMetadata
from pipe_exec.graph_runner import DecodeGraphRunner
from pipe_exec.model import PipelineLM
from pipe_exec.sampler import Sampler

logger = logging.getLogger(__name__)


class StepInputs:
    """Fresh per step; the graph runner copies out of it into its static inputs."""

    def __init__(self, n: int, device):
        self.input_ids = torch.empty(n, dtype=torch.int64, device=device)  # ok: FC107
        self.positions = torch.empty(n, dtype=torch.int64, device=device)


class AsyncPipelineEngine:
    def __init__(self, cfg: PipelineConfig, tokenizer, device: str = "cuda"):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.device = device
        self.pool = PagedKVPool(cfg, device)
        self.backend = FlashInferPipelineBackend(cfg, self.pool, device)
        self.model = PipelineLM(cfg, self.backend).to(device=device, dtype=torch.bfloat16)
        self.graphs = DecodeGraphRunner(self.model, self.backend, cfg, device)
        self.sampler = Sampler(cfg, device)
        self.queue = BoundedStepQueue(cfg.queue_depth)
        self.ring = PinnedOutputRing(cfg, cfg.queue_depth + 1)
        self.processor = OutputProcessor(
            self.queue, self.ring, IncrementalDetokenizer(tokenizer), self._on_finished, self._emit
        )
        self.compute_stream = torch.cuda.Stream()
        n = cfg.max_batch_size
        self.rows: List[Optional[RequestState]] = [None] * n
        self.pages: Dict[str, np.ndarray] = {}
        self.lens: Dict[str, int] = {}
        self.prev_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.stop_flags = torch.zeros(n, dtype=torch.bool, device=device)
        self.temps = torch.ones(n, dtype=torch.float32, device=device)
        self.lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.new_ids_pinned = torch.empty(n, dtype=torch.int64, pin_memory=True)
        self._admitted: List[Tuple[RequestState, int]] = []
        self._finished: List[RequestState] = []
        self._finished_lock = threading.Lock()
        self.text: Dict[str, List[str]] = {}
        self.step_no = 0
        self.eos_hint = 0

    def start(self) -> None:
        self.graphs.capture()
        self.processor.start()

    # ------------------------------------------------------------------ worker callbacks
    def _on_finished(self, reqs: List[RequestState]) -> None:
        with self._finished_lock:
            self._finished.extend(reqs)

    def _emit(self, request_id: str, delta: str, done: bool) -> None:
        self.text.setdefault(request_id, []).append(delta)

    def _drain_finished(self) -> List[RequestState]:
        with self._finished_lock:
            out, self._finished = self._finished, []
        return out

    # ------------------------------------------------------------------ admission (synchronous prefill)
    def admit(self, request_id: str, prompt_ids: List[int], crit: StopCriteria, temperature: float) -> None:
        row = self.rows.index(None)
        page = self.cfg.page_size
        n = len(prompt_ids)
        pages = self.pool.alloc((n + page) // page + 1)
        slots = np.array([pages[p // page] * page + p % page for p in range(n)], dtype=np.int64)
        pm = PrefillMetadata(
            num_tokens=n,
            qo_indptr_cpu=torch.tensor([0, n], dtype=torch.int32),
            slot_mapping=torch.from_numpy(slots).to(self.device),
            positions=torch.arange(n, device=self.device),
            last_rows=torch.tensor([n - 1], device=self.device),
        )
        self.backend.init_forward_metadata_prefill(pm)
        ids = torch.tensor(prompt_ids, dtype=torch.int64, device=self.device)
        logits = self.model.forward_prefill(ids, pm.positions, pm.last_rows)
        first = int(logits.argmax(dim=-1)[0])
        req = RequestState(request_id, row, crit)
        self.rows[row] = req
        self.pages[request_id] = pages
        self.lens[request_id] = n
        self.temps[row] = temperature
        self._admitted.append((req, first))

    # ------------------------------------------------------------------ stage 1
    def _num_rows(self) -> int:
        live = [i for i, r in enumerate(self.rows) if r is not None]
        return live[-1] + 1 if live else 0

    def prepare_next(self) -> Tuple[DecodeMetadata, StepInputs]:
        n = self._num_rows()
        page = self.cfg.page_size
        if self.stop_flags[:n].any():  # expect: FC101
            # rows that sampled eos on the device decode greedily until the worker retires them
            self.temps[:n].masked_fill_(self.stop_flags[:n], 0.0)
        lens = self.lens_cpu.numpy()
        last = self.last_cpu.numpy()
        indptr = self.indptr_cpu.numpy()
        indptr[0] = 0
        page_lists, slots = [], np.zeros(n, dtype=np.int64)
        for row in range(n):
            req = self.rows[row]
            if req is None:
                lens[row], page_list, slots[row] = 1, np.zeros(1, dtype=np.int32), 0
            else:
                rid = req.request_id
                self.lens[rid] += 1
                length = self.lens[rid]
                need = (length + page - 1) // page
                if need > len(self.pages[rid]):
                    self.pages[rid] = np.concatenate([self.pages[rid], self.pool.alloc(need)])
                page_list = self.pages[rid][:need]
                lens[row] = length
                slots[row] = page_list[(length - 1) // page] * page + (length - 1) % page
            page_lists.append(page_list)
            indptr[row + 1] = indptr[row] + len(page_list)
            last[row] = lens[row] - (len(page_list) - 1) * page
        md = DecodeMetadata(
            batch_size=n,
            seq_lens=self.lens_cpu[:n].to(self.device, non_blocking=True),
            seq_lens_cpu=self.lens_cpu[:n],
            kv_indptr_cpu=self.indptr_cpu[: n + 1],
            kv_indices=torch.from_numpy(np.concatenate(page_lists)).pin_memory().to(self.device, non_blocking=True),
            last_page_len_cpu=self.last_cpu[:n],
            slot_mapping=torch.from_numpy(slots).pin_memory().to(self.device, non_blocking=True),
        )
        inputs = StepInputs(n, self.device)
        inputs.input_ids.copy_(self.prev_ids[:n])
        inputs.positions.copy_(md.seq_lens - 1)
        if self._admitted:
            k = len(self._admitted)
            if self.new_ids_pinned.numel() < k:
                self.new_ids_pinned = torch.empty(2 * k, dtype=torch.int64, pin_memory=True)  # ok: FC107
            rows_np = np.array([req.row for req, _ in self._admitted], dtype=np.int64)
            self.new_ids_pinned[:k] = torch.tensor([tok for _, tok in self._admitted], dtype=torch.int64)
            rows_dev = torch.from_numpy(rows_np).to(self.device, non_blocking=True)
            inputs.input_ids.index_copy_(0, rows_dev, self.new_ids_pinned[:k].to(self.device, non_blocking=True))
            self._admitted = []
        return md, inputs

    def _retire_rows(self, finished: List[RequestState]) -> None:
        # the step in flight may still read these rows' pages: let it drain before recycling them
        self.compute_stream.synchronize()  # expect: FC101
        rows = [req.row for req in finished]
        for req in finished:
            self.pool.free(self.pages.pop(req.request_id))
            self.lens.pop(req.request_id)
            self.rows[req.row] = None
        idx = torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True)
        self.backend.graph_last_page_len.index_fill_(0, idx, 1)  # expect: FC104
        self.stop_flags.index_fill_(0, idx, False)
        self.temps.index_fill_(0, idx, 1.0)

    def _launch(self, md: DecodeMetadata, inputs: StepInputs) -> torch.Tensor:
        if md.batch_size <= self.graphs.max_bs:
            return self.graphs.replay(md, inputs.input_ids, inputs.positions)
        self.backend.init_forward_metadata(md)
        return self.model.forward_decode(inputs.input_ids, inputs.positions)

    @flashcheck.hot_path
    def step(self) -> None:
        finished = self._drain_finished()
        if finished:
            self._retire_rows(finished)
        md, inputs = self.prepare_next()
        n = md.batch_size
        if n == 0:
            return
        slot = self.ring.acquire()
        slot.num_rows = n
        rows = [r for r in self.rows[:n] if r is not None]
        slot.request_ids = [r.request_id for r in rows]
        with torch.cuda.stream(self.compute_stream):
            logits = self._launch(md, inputs)
            next_ids, self.eos_hint = self.sampler.sample(logits, self.temps[:n], slot, self.cfg.eos_token_id)
            self.prev_ids[:n].copy_(next_ids)
            torch.eq(next_ids, self.cfg.eos_token_id, out=self.stop_flags[:n])
        logger.debug("step %d launched %d rows, next ids %s", self.step_no, n, next_ids)  # ok: FC101
        self.queue.put(StepRecord(self.step_no, slot, rows))
        self.step_no += 1

    def shutdown(self) -> None:
        self.processor.join()
