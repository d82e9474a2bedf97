import logging
from typing import List

import numpy as np
import torch

from kvtiers import Tier, TierConfig, TierTable
from kvtiers.quant import Int4Quantizer
from tier_attn.attention import TieredAttention
from tier_attn.meta import TierStepMeta

from .model import TierModel
from .runner import TierGraphRunner

logger = logging.getLogger(__name__)


class TierMigrator:
    """Moves pages down a tier once they are old enough: bf16 -> fp8 -> int4."""

    def __init__(self, cfg: TierConfig, table: TierTable, attn: TieredAttention, kv: List[List[torch.Tensor]]):
        self.cfg = cfg
        self.table = table
        self.attn = attn
        self.kv = kv
        self.quantizer = Int4Quantizer(cfg.int4_group_size)
        self.next_fp8_slot = 0

    def _aged_host(self, tier: Tier, after: int) -> np.ndarray:
        return np.flatnonzero((self.table.age_np > after) & (self.table.tier_np == int(tier)))  # ok: FC101

    def migrate_aged(self) -> int:
        old = (self.table.age > self.cfg.fp8_after_steps) & (self.table.tier == int(Tier.BF16))
        pages = torch.nonzero(old).squeeze(1)  # expect: FC101
        pages_np = self._aged_host(Tier.BF16, self.cfg.fp8_after_steps)
        if pages_np.size == 0:
            return 0
        total = int(pages_np.size) * self.cfg.page_size
        slots = self.table.slot[pages].long()
        rows = torch.repeat_interleave(slots, torch.full_like(slots, self.cfg.page_size), output_size=total)  # ok: FC101
        dst_np = np.arange(self.next_fp8_slot, self.next_fp8_slot + pages_np.size, dtype=np.int32)
        dst = torch.from_numpy(dst_np).to(slots.device, non_blocking=True)
        for layer_kv in self.kv:
            layer_kv[Tier.FP8][dst] = layer_kv[Tier.BF16][slots].to(torch.float8_e4m3fn)
        # retire the bf16 slots from the graph decode's page list so the next plan skips them
        self.attn.bf16_indices.index_fill_(0, slots, 0)  # expect: FC104
        self.table.move(pages_np, Tier.FP8, dst_np)
        self.next_fp8_slot += int(pages_np.size)
        logger.debug("migrated %d pages (%d rows) to fp8", pages_np.size, rows.numel())
        return int(pages_np.size)


class TieredEngine:
    def __init__(self, cfg: TierConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = device
        self.table = TierTable(cfg, torch.device(device))
        self.attn = TieredAttention(cfg, self.table, device)
        self.attn.init_bf16_buffers()
        shape = (cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [
            [
                torch.zeros(cfg.pages_per_tier[0], 2, *shape, dtype=torch.bfloat16, device=device),
                torch.zeros(cfg.pages_per_tier[1], 2, *shape, dtype=torch.float8_e4m3fn, device=device),
                torch.zeros(cfg.pages_per_tier[2], 2, *shape[:-1], shape[-1] // 2, dtype=torch.uint8, device=device),
            ]
            for _ in range(cfg.num_layers)
        ]
        self.model = TierModel(cfg, self.attn).to(device)
        self.migrator = TierMigrator(cfg, self.table, self.attn, self.kv)
        self.runner = TierGraphRunner(cfg, self.model, self.attn, self.kv)

    def _build_meta(self, tables: dict) -> TierStepMeta:
        return TierStepMeta(
            batch=tables["batch"],
            bf16_indptr_host=torch.from_numpy(tables["bf16_indptr"]),
            bf16_indices=torch.from_numpy(tables["bf16_indices"]).to(self.device, non_blocking=True),
            bf16_last_page_len_host=torch.from_numpy(tables["bf16_last"]),
            fp8_indptr_host=torch.from_numpy(tables["fp8_indptr"]),
            fp8_indices=torch.from_numpy(tables["fp8_indices"]).to(self.device, non_blocking=True),
            fp8_last_page_len=torch.from_numpy(tables["fp8_last"]).to(self.device, non_blocking=True),
            int4_indptr_host=torch.from_numpy(tables["int4_indptr"]),
            int4_indices=torch.from_numpy(tables["int4_indices"]).to(self.device, non_blocking=True),
            int4_last_page_len_host=torch.from_numpy(tables["int4_last"]),
            tier_ids=self.table.tier[torch.from_numpy(tables["pages"]).to(self.device)],
            graph_bs=next((b for b in self.cfg.graph_buckets if b >= tables["batch"]), None),
        )

    def step(self, tables: dict, tokens: torch.Tensor) -> torch.Tensor:
        self.table.tick()
        self.migrator.migrate_aged()
        meta = self._build_meta(tables)
        n_int4 = tables["int4_indices"].shape[0]
        if n_int4:
            c = self.cfg
            meta.dequant_pages = torch.empty(n_int4, 2, c.page_size, c.num_kv_heads, c.head_dim,  # ok: FC107
                                             dtype=torch.bfloat16, device=self.device)
        if meta.graph_bs is not None:
            return self.runner.prepare_replay(meta, tokens)
        self.attn.prepare_tiers(meta)
        return self.model(tokens, self.kv, meta)
