"""Per-step metadata: host arithmetic on numpy views of pinned buffers."""
from __future__ import annotations

import numpy as np
import torch

from pcache import BlockPool, PrefixCacheConfig
from pc_attn.block_table import BlockTable
from pc_attn.metadata import PrefixStepMeta, StepBatch


class PrefixMetadataBuilder:
    def __init__(self, cfg: PrefixCacheConfig, block_table: BlockTable, pool: BlockPool, device: torch.device):
        self.cfg, self.block_table, self.pool, self.device = cfg, block_table, pool, device
        n = cfg.max_num_seqs
        self.qo_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(n, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(n * cfg.max_blocks_per_seq, dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(n, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(n * cfg.max_blocks_per_seq, dtype=torch.int32, device=device)

    def build(self, batch: StepBatch) -> PrefixStepMeta:
        n, bsz = batch.num_reqs, self.cfg.block_size
        for slot, ids in batch.new_rows.items():
            self.block_table.set_row(slot, ids)
        self.block_table.commit(batch.slots)
        nb_np = self.block_table.num_blocks_np[batch.slots]
        ql_np = batch.query_lens_cpu.numpy()[:n]
        sl_np = batch.seq_lens_cpu.numpy()[:n]

        qo_np, kv_np = self.qo_indptr_cpu.numpy(), self.kv_indptr_cpu.numpy()
        qo_np[0] = kv_np[0] = 0
        np.cumsum(ql_np, out=qo_np[1 : n + 1])
        np.cumsum(nb_np, out=kv_np[1 : n + 1])
        self.last_page_len_cpu.numpy()[:n] = (sl_np - 1) % bsz + 1
        total = int(kv_np[n])
        idx_np = self.kv_indices_cpu.numpy()
        for i, slot in enumerate(batch.slots):
            idx_np[kv_np[i] : kv_np[i + 1]] = self.block_table.block_ids_np[slot, : nb_np[i]]

        # cache-hit statistics: host count for the scheduler, device sum for the report
        hit_lens_np = batch.prefix_lens_np[:n][batch.prefix_lens_np[:n] > 0]  # ok: FC101
        hit_rows = batch.prefix_lens > 0
        self.pool.hit_tokens_dev += batch.prefix_lens[hit_rows].sum()  # expect: FC101
        self.pool.query_tokens_dev += int(ql_np.sum()) + int(hit_lens_np.sum())

        self.qo_indptr[: n + 1].copy_(self.qo_indptr_cpu[: n + 1], non_blocking=True)
        self.last_page_len[:n].copy_(self.last_page_len_cpu[:n], non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens_cpu[:n], non_blocking=True)
        self.kv_indices[:total].copy_(self.kv_indices_cpu[:total], non_blocking=True)
        max_seq_len = int(self.block_table.widest_row) * bsz  # expect: FC101
        return PrefixStepMeta(
            num_reqs=n, num_decodes=batch.num_decodes, num_prefill_tokens=int(qo_np[n]) - batch.num_decodes,
            qo_indptr=self.qo_indptr[: n + 1], qo_indptr_cpu=self.qo_indptr_cpu[: n + 1],
            kv_indptr_cpu=self.kv_indptr_cpu[: n + 1], kv_indices=self.kv_indices[:total],
            last_page_len_cpu=self.last_page_len_cpu[:n], last_page_len=self.last_page_len,
            seq_lens_cpu=batch.seq_lens_cpu[:n], seq_lens=self.seq_lens[:n],
            block_tables=self.block_table.block_ids, max_seq_len=max_seq_len,
            shared_prefix_blocks=batch.shared_prefix_blocks,
        )
