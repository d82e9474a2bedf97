import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from embedserve.attn.ragged_backend import RaggedEmbedBackend
from embedserve.batch import EmbedBatch
from embedserve.config import EmbedConfig
from embedserve.models.encoder import EncoderModel

logger = logging.getLogger(__name__)


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    last_idx: torch.Tensor
    pooled: torch.Tensor


class Pooler:
    def __init__(self, cfg: EmbedConfig, device):
        self.cfg, self.device, self.norm_scratch = cfg, device, None

    def normalize(self, pooled, bs):
        if self.norm_scratch is None:
            self.norm_scratch = torch.empty(self.cfg.max_batch, dtype=torch.float32, device=self.device)  # ok: FC107
        norms = torch.linalg.vector_norm(pooled.float(), dim=-1, out=self.norm_scratch[:bs]).unsqueeze(-1)
        logger.debug("pooled norms %s", norms)  # ok: FC101
        logger.info(f"pooled {bs} rows, mean norm {norms.mean()}")  # expect: FC101
        return torch.where(norms > 0, pooled / norms.clamp_min(1e-12), pooled)  # ok: FC101


class EmbedGraphRunner:
    def __init__(self, model: EncoderModel, backend: RaggedEmbedBackend, cfg: EmbedConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = backend.device
        self.graphs: dict[int, GraphEntry] = {}
        self.max_tokens = max(cfg.token_buckets)
        self.input_ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_tokens, dtype=torch.int64, device=self.device)
        self.pooler = Pooler(cfg, self.device)
        self.mempool = None

    def bucket_for(self, batch: EmbedBatch):
        if len(batch.seq_lens_cpu) > self.cfg.max_batch:
            return None
        return next((n for n in self.cfg.token_buckets if batch.num_tokens <= n), None)

    def capture_all(self):
        self.backend.init_cuda_graph_state()
        for n in self.cfg.token_buckets:
            self.capture_token_bucket(n)
        self._check_graph_state()

    def _check_graph_state(self):
        assert len(self.graphs) == len(self.cfg.token_buckets)  # ok: FC109

    def capture_token_bucket(self, n: int):
        bs = min(n, self.cfg.max_batch)
        self.backend.init_forward_metadata_capture_cuda_graph(n, bs)
        last_idx = torch.zeros(self.cfg.max_batch, dtype=torch.int64, device=self.device)
        pooled = torch.zeros(self.cfg.max_batch, self.cfg.hidden_size, device=self.device)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            qo = self.backend.qo_indptr
            if (qo[1:] < qo[:-1]).any():  # expect: FC101
                raise RuntimeError("qo_indptr is not monotone")
            hidden = self.model(self.input_ids[:n], self.positions[:n], rerank=True)
            pooled.copy_(F.normalize(hidden.index_select(0, last_idx), dim=-1))
        self.mempool = graph.pool()
        self.graphs[n] = GraphEntry(graph, self.input_ids[:n], self.positions[:n], last_idx, pooled)

    def replay(self, batch: EmbedBatch):
        n = self.bucket_for(batch)
        entry = self.graphs[n]
        bs = len(batch.seq_lens_cpu)
        entry.input_ids[: batch.num_tokens].copy_(batch.input_ids)
        entry.positions[: batch.num_tokens].copy_(batch.positions)
        self.backend.init_forward_metadata_replay_cuda_graph(n, batch)
        entry.last_idx = (batch.cu_seqlens[1:] - 1).long().clone()  # expect: FC107
        entry.graph.replay()
        out = entry.pooled[:bs]
        if torch.isnan(out).any():  # expect: FC101
            raise FloatingPointError("NaN in pooled embeddings")
        return self.pooler.normalize(out, bs)
