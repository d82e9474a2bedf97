"""One step: either one long prompt's chunked prefill or a decode batch."""

import torch

from splitkv import ChunkPlanner, SplitConfig, StepWork
from splitkv_attn.backend import SplitAttnBackend
from splitkv_run.graphs import BucketGraphRunner
from splitkv_run.model import SplitModel
from splitkv_run.runner import ChunkedPrefillRunner


class LongPromptEngine:
    def __init__(self, cfg: SplitConfig, kv_cache: torch.Tensor, device: str = "cuda"):
        dev = torch.device(device)
        self.cfg = cfg
        self.kv_cache = kv_cache
        self.backend = SplitAttnBackend(cfg, dev)
        self.planner = ChunkPlanner(cfg)
        self.model = SplitModel(cfg, self.backend).to(dev)
        self.prefill_runner = ChunkedPrefillRunner(cfg, self.backend, self.planner, self.model, kv_cache)
        self.graphs = BucketGraphRunner(cfg, self.model, self.backend, kv_cache)
        self.max_graph_bs = max(cfg.buckets)
        self.finished_prefills = []

    def warmup(self) -> None:
        self.graphs.record_all()

    def step(self, work: StepWork) -> torch.Tensor:
        if work.prefill is not None:
            logits = self.prefill_runner.run_chunks(work.prefill)
            # the scheduler hands the prompt to decode only once its KV is complete
            self.prefill_runner.last_event.synchronize()  # expect: FC101
            self.finished_prefills.append(work.prefill.request_id)
            return logits
        rows = work.decode
        if rows.batch_size <= self.max_graph_bs:
            return self.graphs.replay_bucket(rows)
        self.backend.plan_eager_decode(rows)
        return self.model.decode_eager(rows.tokens_dev, rows.positions_dev, self.kv_cache)

    def stats(self) -> dict:
        out = self.graphs.replay_stats()
        out.update(self.backend.workspace_report())
        out["last_split"] = self.planner.last_split
        out.update(self.prefill_runner.lse_summary())
        return out
