"""Graph capture/replay and the engine loop tying the scheduler to the model."""

import bisect
import logging
from typing import Dict, List, Optional

import torch

from qos import PreemptionManager, QoSScheduler, StepPlan, TenantLedger
from qos_exec.backend import AttnShape, QoSAttentionBackend
from qos_exec.metadata import QoSMetadataBuilder, QoSStepMeta
from qos_exec.model import QoSModel

logger = logging.getLogger(__name__)


class QoSModelRunner:
    def __init__(self, model: QoSModel, backend: QoSAttentionBackend, shape: AttnShape, device: torch.device):
        self.model = model
        self.backend = backend
        self.shape = shape
        self.device = device
        self.static_ids = torch.zeros(shape.max_batch_size, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def bucket(self, n: int) -> Optional[int]:
        b = sorted(self.graphs)
        i = bisect.bisect_left(b, n)
        return b[i] if i < len(b) else None

    def capture_one_batch_size(self, bs: int, kv_caches: List[torch.Tensor], meta: QoSStepMeta) -> None:
        torch.cuda.synchronize()  # ok: FC101
        longest = meta.seq_lens[:bs].max().item()  # expect: FC101
        if longest > 1:
            q = torch.zeros(bs, self.shape.num_qo_heads, self.shape.head_dim, dtype=torch.float16, device=self.device)
            self.backend.warmup_prefill(q, kv_caches[0])
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.model.decode(self.static_ids[:bs], kv_caches, meta, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.decode(self.static_ids[:bs], kv_caches, meta, bs)
        self.pool = g.pool()
        self.graphs[bs] = g

    def capture_all(self, kv_caches: List[torch.Tensor], metas: Dict[int, QoSStepMeta]) -> None:
        self.backend.init_graph_wrappers()
        for bs in sorted(metas, reverse=True):
            self.capture_one_batch_size(bs, kv_caches, metas[bs])
        logger.info("captured %d decode graphs", len(self.graphs))

    def replay(self, bs: int, meta: QoSStepMeta, ids: torch.Tensor) -> torch.Tensor:
        n = meta.num_decode
        self.static_ids[:n].copy_(ids)
        if bool(self.backend.row_priority[:n].lt(0).any()):  # expect: FC101
            raise RuntimeError("negative priority reached the decode graph")
        self.graphs[bs].replay()
        return self.outputs[bs][:n]


class QoSEngine:
    def __init__(self, shape: AttnShape, device: torch.device, num_pages: int, hidden: int = 4096,
                 layers: int = 32, vocab: int = 32000):
        self.shape = shape
        self.device = device
        self.backend = QoSAttentionBackend(shape, device)
        self.kv_caches = [torch.zeros(num_pages, 2, shape.page_size, shape.num_kv_heads, shape.head_dim,
                                      dtype=torch.float16, device=device) for _ in range(layers)]
        self.ledger = TenantLedger()
        self.preempt = PreemptionManager(self.kv_caches, self.backend.kv_indices, shape.max_pages // shape.max_batch_size)
        self.scheduler = QoSScheduler(self.ledger, self.preempt, num_pages, shape.page_size,
                                      shape.max_batch_size, max_prefill_tokens=8192)
        self.builder = QoSMetadataBuilder(self.ledger, shape.page_size, 131072, device)
        self.model = QoSModel(hidden, layers, vocab, shape, self.backend).to(device)
        self.runner = QoSModelRunner(self.model, self.backend, shape, device)

    def warmup(self, dummy_plans: Dict[int, StepPlan]) -> None:
        metas = {bs: self.builder.build(plan) for bs, plan in dummy_plans.items()}
        self.runner.capture_all(self.kv_caches, metas)

    def run_once(self, decode_ids: torch.Tensor, prefill_ids: torch.Tensor) -> List[torch.Tensor]:
        plan = self.scheduler.schedule()
        outs = []
        if plan.resumed:
            rows = self.builder.build_resume(plan.resumed)
            self.backend.plan_resume(rows)
            outs.append(self.model.prefill(decode_ids[: rows.count], self.kv_caches, True))
        meta = self.builder.build(plan)
        bs = self.runner.bucket(meta.num_decode)
        if meta.num_prefill or bs is None:
            meta.graph = False
            self.backend.init_forward_metadata(meta)
            if meta.num_decode:
                outs.append(self.model.decode(decode_ids, self.kv_caches, meta, meta.num_decode))
            if meta.num_prefill:
                outs.append(self.model.prefill(prefill_ids, self.kv_caches, False))
        else:
            self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
            outs.append(self.runner.replay(bs, meta, decode_ids))
        self.scheduler.finish(plan)
        return outs
