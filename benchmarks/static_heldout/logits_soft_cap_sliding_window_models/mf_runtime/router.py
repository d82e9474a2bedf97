"""Routes each step's rows to their family and runs one decode per family present."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import torch

from mfserve import FAMILY_SPECS, FamilySpec, RowState, ServeConfig
from mf_attn.backend import FamilyBackend
from mf_runtime.batch import build_family_batch
from mf_runtime.graphs import FamilyGraphs
from mf_runtime.model import FamilyModel


class MultiFamilyRouter:
    def __init__(self, cfg: ServeConfig, families: List[str], device: str = "cuda"):
        self.cfg, self.device = cfg, torch.device(device)
        specs = [FAMILY_SPECS[f] for f in families]
        self._backend = FamilyBackend(cfg, specs, self.device)  # ok: FC103
        self.models: Dict[str, FamilyModel] = {}
        self.order: List[str] = []
        self.active: List[RowState] = []
        for spec in specs:
            self.register_family(spec)
        self.graphs = FamilyGraphs(self.models, self._backend, cfg, self.device)
        self.graphs.capture_all()

    def register_family(self, spec: FamilySpec) -> None:
        assert spec.name not in self.models, "family registered twice"  # expect: FC109
        self._backend.add_family(spec)
        self.models[spec.name] = FamilyModel(spec, self._backend, self.cfg, self.device).to(self.device)
        self.order.append(spec.name)

    def _evict_longest(self, fam: str) -> None:
        rows = [r for r in self.active if r.family == fam]
        self.active.remove(max(rows, key=lambda r: len(r.tokens)))

    def step(self) -> Dict[str, torch.Tensor]:
        family_ids_np = np.array([self.order.index(r.family) for r in self.active], dtype=np.int64)
        counts = np.bincount(family_ids_np, minlength=len(self.order))
        sampled: Dict[str, torch.Tensor] = {}
        for k in np.flatnonzero(counts).tolist():  # ok: FC101
            fam = self.order[k]
            spec = self._backend.specs[fam]
            rows = [r for r in self.active if r.family == fam]
            batch = build_family_batch(rows, spec, self.cfg.page_size, self.device)
            if batch.seq_lens.max() >= self.cfg.max_model_len:  # expect: FC101
                self._evict_longest(fam)
            if self.graphs.can_replay(fam, batch.num_rows):
                logits = self.graphs.replay(fam, batch)
            else:
                self._backend.prepare_step(fam, batch)
                logits = self.models[fam].forward_decode(batch.input_ids, batch.positions, None)
            sampled[fam] = torch.argmax(logits, dim=-1)
        return sampled
