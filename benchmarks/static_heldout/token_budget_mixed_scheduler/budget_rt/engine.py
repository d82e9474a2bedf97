"""The engine loop: schedule, build inputs, run a decode graph or an eager mixed step, sample."""

import torch

from budget.attn.kv_pool import PagedKVPool
from budget.attn.mixed_backend import MixedFlashInferBackend
from budget.config import BudgetConfig
from budget.request import SchedulerOutput
from budget.scheduler import BudgetScheduler
from budget.step_meta import StepMetadata
from budget_rt.graph_runner import DecodeOnlyGraphRunner
from budget_rt.model import MixedLM


class StepTokens:
    """Device inputs of one step, built fresh every step."""

    def __init__(self, out: SchedulerOutput, device) -> None:
        self.input_ids = torch.from_numpy(out.input_ids_np).to(device, non_blocking=True)
        self.positions = torch.empty(out.num_tokens, dtype=torch.long, device=device)  # ok: FC107
        self.positions.copy_(torch.from_numpy(out.positions_np), non_blocking=True)
        self.logits_rows = torch.from_numpy(out.logits_rows_np).to(device, non_blocking=True)


class MixedEngine:
    def __init__(self, cfg: BudgetConfig) -> None:
        self.cfg = cfg
        self.pool = PagedKVPool(cfg)
        self.meta = StepMetadata(cfg)
        self.backend = MixedFlashInferBackend(cfg, self.meta, self.pool)
        self.model = MixedLM(cfg, self.backend, self.pool).to(cfg.device, torch.bfloat16)
        self.graphs = DecodeOnlyGraphRunner(cfg, self.model, self.backend)
        self.scheduler = BudgetScheduler(cfg, self.pool)

    def capture(self) -> None:
        self.backend.check_layout()
        for bs in reversed(self.cfg.decode_buckets):
            self.graphs.capture_one_batch_size(bs)

    def step(self) -> int:
        out = self.scheduler.schedule()
        if out.num_tokens == 0:
            return 0
        rows = out.num_decodes + out.num_prefills
        self.meta.ensure_capacity(rows)
        tokens = StepTokens(out, self.cfg.device)
        if self.graphs.can_run(out):
            logits = self.graphs.replay(out, tokens.input_ids)
        else:
            self.backend.init_forward_metadata(out)
            logits = self.model.forward_mixed(tokens.input_ids, tokens.logits_rows)
        next_ids = torch.argmax(logits, dim=-1)
        self.scheduler.pending.stage(next_ids, out.sampled_rows)
        self.meta.reset()
        return rows
