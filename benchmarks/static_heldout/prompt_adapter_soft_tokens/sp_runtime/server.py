"""The soft-prompt server: one step per call, outputs drained by a pump thread."""

import threading
from typing import Dict, List

import flashcheck
import torch

from softprompt.adapter_cache import AdapterCache
from softprompt.attn.backend import SoftPromptAttention
from softprompt.attn.metadata import SoftBatch, StepMetaBuilder
from softprompt.config import SoftPromptConfig
from softprompt.slot_table import EmbeddingSlotTable
from sp_runtime.graphs import SoftPromptGraphBank
from sp_runtime.model import SoftPromptLM
from sp_runtime.scheduler import SoftRequest, SoftScheduler


class SoftPromptServer:
    def __init__(self, cfg: SoftPromptConfig) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.table = EmbeddingSlotTable(
            cfg.max_adapters, cfg.max_virtual_tokens, cfg.hidden_size, cfg.max_batch_size, torch.bfloat16, cfg.device
        )
        self.adapters = AdapterCache(self.table, cfg.max_adapter_ids, cfg.grow_slots_by)
        self.backend = SoftPromptAttention(cfg)
        self.kv_caches = [
            torch.zeros(
                cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device
            )
            for _ in range(cfg.num_layers)
        ]
        self.model = SoftPromptLM(cfg, self.backend, self.table).to(cfg.device)
        self.meta_builder = StepMetaBuilder(self.table, cfg.device)
        self.graphs = SoftPromptGraphBank(cfg, self.model, self.backend, self.table, self.kv_caches)
        self.scheduler = SoftScheduler(cfg)
        self.out_host = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.out_event = torch.cuda.Event()
        self.last_bs = 0

    def add_request(self, req_id: int, prompt_ids: List[int], adapter_id: int, max_new_tokens: int) -> None:
        virtual = 0
        if adapter_id >= 0:
            if adapter_id not in self.adapters.host_store:
                raise KeyError(f"adapter {adapter_id} is not registered")
            virtual = self.adapters.host_store[adapter_id].shape[0]
            self.adapters.pin(adapter_id)
        self.scheduler.add(SoftRequest(req_id, list(prompt_ids), adapter_id, virtual, max_new_tokens))

    def staging_capacity(self) -> int:
        return self.backend.loader_scratch().numel()

    @flashcheck.hot_path
    def step(self) -> int:
        batch = self.scheduler.next_batch()
        if batch is None:
            return 0
        bs = batch.bs
        adapter_ids = torch.from_numpy(batch.adapter_ids_np).to(self.device, non_blocking=True)
        if batch.adapter_ids_np.max() >= self.cfg.max_adapter_ids:
            raise ValueError(f"adapter id out of range in batch: {adapter_ids}")  # ok: FC101
        slots_np = self.adapters.ensure_resident(batch.adapter_ids_np, adapter_ids)
        self.table.stage_rows(torch.from_numpy(slots_np), torch.from_numpy(batch.virtual_lens_np))
        meta = self.meta_builder.make(batch)
        input_ids = torch.from_numpy(batch.input_ids_np).to(self.device, non_blocking=True)
        gbs = self.cfg.bucket_for(bs)
        n = self.cfg.prefill_bucket_for(meta.num_tokens)
        if batch.is_decode and gbs in self.graphs.decode_graphs:
            logits = self.graphs.replay(gbs, meta, input_ids)
        elif not batch.is_decode and n in self.graphs.prefill_graphs:
            logits = self.graphs.replay_prefill(n, meta, input_ids)
        else:
            self.backend.init_forward_metadata(meta)
            logits = self.model.forward_eager(input_ids, self.kv_caches, meta)
        last = logits if batch.is_decode else logits.index_select(0, meta.qo_indptr[1:] - 1)
        next_ids = torch.argmax(last, dim=-1)
        self.out_host[:bs].copy_(next_ids, non_blocking=True)
        self.out_event.record()
        self.last_bs = bs
        self._retire_finished(batch)
        self.scheduler.commit(batch)
        return bs

    def _retire_finished(self, batch: SoftBatch) -> None:
        done = batch.finished_rows_np
        if done.size == 0:
            return
        rows = torch.from_numpy(done).to(self.device, non_blocking=True)
        # finished rows stay in the bucket as padding until the scheduler compacts it
        self.backend.kv_last_page_len.index_fill_(0, rows, 1)  # expect: FC104
        for aid in batch.adapter_ids_np[done].tolist():
            if aid >= 0:
                self.adapters.unpin(int(aid))

    def drain_outputs(self) -> List[int]:
        self.out_event.synchronize()
        return self.out_host[: self.last_bs].tolist()


class OutputPump(threading.Thread):
    def __init__(self, server: SoftPromptServer, sink: Dict[int, List[int]]) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.sink = sink
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            for i, tok in enumerate(self.server.drain_outputs()):
                self.sink.setdefault(i, []).append(tok)
