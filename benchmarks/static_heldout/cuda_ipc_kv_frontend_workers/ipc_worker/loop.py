"""The worker process: one step per frontend message, results handed back through an IPC event."""

import queue
import threading
from typing import Optional

import numpy as np
import torch

from ipckv import IpcHandle, IpcPageRegistry, IpcServeConfig, StepMessage, StepResult
from ipc_worker.attention import WorkerAttention, describe_plan
from ipc_worker.graphs import WorkerGraphs
from ipc_worker.model import WorkerModel
from ipc_worker.opener import PoolOpener
from ipc_worker.pagetable import apply_page_table
from ipc_worker.stager import BatchStager


class ResultSender(threading.Thread):
    """Waits for each step's event off the step loop, then sends the sampled tokens as numpy."""

    def __init__(self, tokens_pinned: torch.Tensor, outbox):
        super().__init__(name="result-sender", daemon=True)
        self.tokens_pinned = tokens_pinned
        self.outbox = outbox
        self.pending: "queue.Queue[Optional[tuple]]" = queue.Queue()

    def run(self) -> None:
        while True:
            item = self.pending.get()
            if item is None:
                return
            event, result, n = item
            event.synchronize()
            tokens = self.tokens_pinned[:n].tolist()  # ok: FC101
            self.outbox.put((result, np.asarray(tokens, dtype=np.int64)))


class WorkerLoop:
    def __init__(self, cfg: IpcServeConfig, worker_id: int, device: torch.device, inbox, outbox, handle: IpcHandle):
        self.cfg = cfg
        self.worker_id = worker_id
        self.device = device
        self.inbox = inbox
        self.opener = PoolOpener(cfg, handle.device_index)
        self.pool_kv = self.opener.open(handle, cfg.max_pages)
        self.registry = IpcPageRegistry(cfg.max_pages, device)
        self.registry.register(handle)
        self.stager = BatchStager(cfg, device)
        self.attn = WorkerAttention(cfg, device, worker_id)
        self.attn.init_graph_wrappers()
        self.model = WorkerModel(cfg, self.attn, self.pool_kv, device)
        self.graphs = WorkerGraphs(self.model, self.attn, cfg, device)
        self.tokens_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.done_event = torch.cuda.Event(interprocess=True)
        self.sender = ResultSender(self.tokens_pinned, outbox)
        self.sender.start()
        self.sample_out: Optional[torch.Tensor] = None
        self.prestage_next = True

    def step(self) -> None:
        msg: StepMessage = self.inbox.get()
        self.registry.refresh(msg.epochs_np)
        staged = self.stager.stage(msg)
        bs = staged.batch_size
        host_max = int(msg.seq_lens_np.max())  # ok: FC101
        max_len = int(staged.seq_lens.max())  # expect: FC101
        if self.sample_out is None:
            self.sample_out = torch.empty(self.cfg.max_batch, dtype=torch.int64, device=self.device)  # ok: FC107
        if msg.is_prefill:
            self.attn.plan_prefill(staged)
            max_q = int(np.diff(msg.qo_indptr_np).max())
            logits = self.model.prefill(staged, max_q, host_max)
            last = torch.from_numpy(msg.qo_indptr_np[1:] - 1).to(self.device, non_blocking=True)
            logits = logits.index_select(0, last)
        elif msg.bucket:
            if self.prestage_next:
                # overlap: push the page list into the graph's indices as soon as the message lands
                apply_page_table(self.attn.g_indices, self.attn.indices_pinned, self.attn.indices_np, msg.page_table_np, msg.seq_lens_np, self.cfg.page_size)  # expect: FC104
            self.graphs.static_positions = staged.positions.clone()  # expect: FC107
            self.attn.prepare_bucket(msg.bucket, msg)
            logits = self.graphs.replay(msg.bucket, staged)
        elif host_max > self.cfg.long_ctx_len:
            logits = self.model.decode_long(staged, max_len)
        else:
            self.attn.plan_eager(staged)
            logits = self.model.decode_eager(staged.input_ids)
        torch.argmax(logits, dim=-1, out=self.sample_out[:bs])
        self.tokens_pinned[:bs].copy_(self.sample_out[:bs], non_blocking=True)
        self.done_event.record()
        result = StepResult(step_id=msg.step_id, worker=self.worker_id, event_handle=self.done_event.ipc_handle(), num_tokens=bs)
        self.sender.pending.put((self.done_event, result, bs))

    def report(self) -> str:
        parts = [self.opener.describe()]
        parts.extend(describe_plan(w) for w in self.attn.bucket_wrappers.values())
        return "\n".join(parts)
