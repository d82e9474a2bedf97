from typing import Dict

import torch

from ipckv import IpcServeConfig, StepMessage
from ipc_worker.attention import WorkerAttention
from ipc_worker.model import WorkerModel
from ipc_worker.stager import StagedBatch


class WorkerGraphs:
    def __init__(self, model: WorkerModel, attn: WorkerAttention, cfg: IpcServeConfig, device: torch.device):
        self.model = model
        self.attn = attn
        self.cfg = cfg
        mb = max(cfg.decode_buckets)
        self.static_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros((mb, cfg.vocab_size), dtype=torch.float32, device=device)
        self.copy_stream = torch.cuda.Stream()
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None

    def record_all(self, warm_msgs: Dict[int, StepMessage]) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.attn.prepare_bucket(bs, warm_msgs[bs])
            with torch.cuda.stream(self.copy_stream):
                self.static_ids[:bs].zero_()
            self.copy_stream.synchronize()  # ok: FC101
            self.static_logits[:bs].copy_(self.model.decode_graph(self.static_ids[:bs], bs))
            if torch.isnan(self.static_logits[:bs]).any():  # expect: FC101
                raise RuntimeError(f"warm-up decode for bucket {bs} produced NaN logits")
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.static_logits[:bs].copy_(self.model.decode_graph(self.static_ids[:bs], bs))
            if self.pool is None:
                self.pool = g.pool()
            self.graphs[bs] = g

    def replay(self, bs: int, staged: StagedBatch) -> torch.Tensor:
        real = staged.batch_size
        self.static_ids[:real].copy_(staged.input_ids)
        self.static_positions[:real].copy_(staged.positions)
        self.graphs[bs].replay()
        return self.static_logits[:real]
