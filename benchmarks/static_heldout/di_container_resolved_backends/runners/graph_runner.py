import logging
from dataclasses import dataclass
from typing import Dict, List
import torch
from diengine.batch import ForwardBatch
from diengine.config import EngineConfig
from diengine.interfaces import AttentionBackend
from runners.model import DecoderModel

logger = logging.getLogger(__name__)

_GRAPH_FLAG = "_use_cuda_graph"


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor
    positions: torch.Tensor

class GraphRunner:
    def __init__(self, config: EngineConfig, backend: AttentionBackend, model: DecoderModel):
        sizes: List[int] = list(config.capture_sizes)
        assert sizes == sorted(sizes), "capture sizes must be ascending"  # expect: FC109
        self.cfg, self.device = config, torch.device(config.device)
        self.backend, self.model = backend, model
        self.capture_sizes, self.max_bs = sizes, sizes[-1]
        self.graphs: Dict[int, GraphEntry] = {}
        self.static_out: Dict[int, torch.Tensor] = {}
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.seq_lens_buf = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.mempool = None

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        ones_cpu, indptr_cpu = torch.ones(bs, dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)
        zeros = torch.zeros(bs, dtype=torch.int32, device=self.device)
        seq_lens = self.seq_lens_buf[:bs]
        return ForwardBatch(True, bs, bs, self.input_ids[:bs], self.positions[:bs], seq_lens, ones_cpu,
                            seq_lens, ones_cpu, zeros, indptr_cpu, indptr_cpu.to(self.device), indptr_cpu, zeros,
                            seq_lens, ones_cpu, zeros.long(), zeros.long())

    def capture(self) -> None:
        self.backend.init_cuda_graph_state(self.max_bs)
        self.mempool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.capture_sizes):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for _ in range(2):
            self.model.decode(self.input_ids[:bs], self.positions[:bs], fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        self.static_out[bs] = torch.empty(bs, 128256, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        with torch.cuda.graph(g, pool=self.mempool):
            out = self.model.decode(self.input_ids[:bs], self.positions[:bs], fb)
            self.static_out[bs].copy_(out)
        if not torch.isfinite(out).all():  # expect: FC101
            raise RuntimeError(f"non-finite logits while capturing bs={bs}")
        self.graphs[bs] = GraphEntry(graph=g, out=self.static_out[bs], positions=self.positions[:bs])
        for w in getattr(self.backend, "graph_wrappers", {}).values():
            if not getattr(w, _GRAPH_FLAG, False):  # expect: FC103
                raise RuntimeError("decode graph wrapper was built outside CUDA-graph mode")

    def replay(self, fb: ForwardBatch):
        real_bs = fb.batch_size
        bs = next(size for size in self.capture_sizes if size >= real_bs)
        entry = self.graphs[bs]
        self.input_ids[:real_bs].copy_(fb.input_ids, non_blocking=True)  # ok: FC104
        entry.positions = fb.positions.clone()  # expect: FC107
        self.backend.kv_last_page_len[real_bs:bs].fill_(1)  # ok: FC104
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.backend.kv_indptr[real_bs + 1 : bs + 1] = self.backend.kv_indptr[real_bs]  # expect: FC104
        entry.graph.replay()
        logger.info(f"replayed bs={bs} (real {real_bs}) seq_lens={fb.seq_lens}")  # expect: FC101
        return entry.out[:real_bs]

