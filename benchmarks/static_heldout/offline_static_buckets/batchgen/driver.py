"""The offline driver: prefill a bucket, decode it to completion, write it out."""
from __future__ import annotations

import logging
from typing import List, Sequence

import numpy as np
import torch

from batchgen._C import pack_prompts  # compiled helper: packs token lists into a flat pinned buffer
from batchgen.buckets import BucketTable, PackedBucket
from batchgen.flashinfer_backend import OfflineFlashInferBackend
from batchgen.graphs import BucketGraphRunner
from batchgen.io.jsonl_sink import JsonlSink
from batchgen.metadata import BucketMetadataBuilder
from batchgen.model import OfflineLlama

logger = logging.getLogger(__name__)

_WORKSPACE_FIELDS = ("_float_workspace_buffer", "_int_workspace_buffer")


class OfflineDriver:
    def __init__(self, table: BucketTable, model_cfg: dict, device: torch.device, page_size: int = 16):
        self.table = table
        self.device = device
        self.page_size = page_size
        c = model_cfg
        self.backend = OfflineFlashInferBackend(table.specs, c["n_q"], c["n_kv"], c["head_dim"], page_size, device)
        self.model = OfflineLlama(c["vocab"], c["hidden"], c["n_layers"], c["n_q"], c["n_kv"], c["head_dim"], self.backend).to(device)
        max_bs = max(s.batch_size for s in table.specs)
        ppr = max(s.pages_per_row(page_size) for s in table.specs)
        self.kv_caches = [
            torch.empty(max_bs * ppr + 1, 2, page_size, c["n_kv"], c["head_dim"], dtype=torch.bfloat16, device=device)
            for _ in range(c["n_layers"])
        ]
        self.builder = BucketMetadataBuilder(max_bs, ppr, page_size, device)
        self.runner = BucketGraphRunner(self.model, self.backend, self.kv_caches, max_bs)
        self.page_table = torch.arange(1, max_bs * ppr + 1, dtype=torch.int32, device=device).view(max_bs, ppr)
        self.tokens = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.tokens_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)

    def report_memory(self) -> None:
        for name in _WORKSPACE_FIELDS:
            buf = getattr(self.backend.prefill_wrapper, name)  # expect: FC103
            logger.info("%s: %.1f MiB", name, buf.numel() * buf.element_size() / 2**20)

    def _reset_bucket(self) -> None:
        # the next bucket reuses the page table from scratch
        self.backend.kv_indices.zero_()  # expect: FC104
        self.builder.seq_lens.zero_()

    def _prefill(self, bucket: PackedBucket) -> None:
        flat, offsets = pack_prompts(bucket.prompt_ids)
        qo_indptr_host = torch.from_numpy(np.asarray(offsets, dtype=np.int32))
        self.backend.plan_prompt_prefill(qo_indptr_host)
        ids = flat.to(self.device, non_blocking=True)
        pos = torch.cat([torch.arange(len(p)) for p in bucket.prompt_ids]).to(self.device, non_blocking=True)
        self.model(ids, pos, self.kv_caches, False)

    def generate(self, prompts: Sequence[List[int]], sink: JsonlSink) -> None:
        self.report_memory()
        for bucket in self.table.pack(list(prompts)):
            self._reset_bucket()
            self._prefill(bucket)
            self.builder.start_bucket(bucket, self.page_table[: bucket.spec.batch_size])
            outs: List[List[int]] = [[] for _ in range(bucket.spec.batch_size)]
            for step in range(bucket.spec.max_new_tokens):
                md = self.builder.build(bucket, step)
                bs = md.bs
                if bs in self.runner.graphs:
                    logits = self.runner.replay(self.tokens[:bs], md)
                else:
                    self.backend.init_forward_metadata(md)
                    logits = self.model(self.tokens[:bs], md.positions, self.kv_caches, True)
                torch.argmax(logits, -1, out=self.tokens[:bs])
                for i, t in enumerate(self.tokens[:bs].tolist()):  # ok: FC101
                    outs[i].append(t)
            for row, idx in enumerate(bucket.row_to_prompt):
                if idx >= 0:
                    sink.put(int(idx), outs[row])
        sink.flush()
