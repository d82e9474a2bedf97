"""Per-bucket CUDA graphs; replay reads the batch back from the step context."""
import logging
from typing import Dict, List, Optional

import torch

from backends.flashinfer_backend import FlashInferAttnBackend
from ctxserve.config import GRAPH_BUCKETS, ServeConfig
from ctxserve.context import CURRENT_GRAPH, CURRENT_META, capture_mode, current_batch, host_staging, is_capturing, step_context
from ctxserve.metadata import ForwardBatch, ForwardMetadata, GraphState
from layers.attention import DecoderModel

logger = logging.getLogger(__name__)

class Sampler:
    """Greedy or temperature sampling; per-request temperatures live on the device."""
    def __init__(self, cfg: ServeConfig, device: torch.device):
        n, self.cfg = cfg.max_running_requests, cfg
        self.temperatures = torch.zeros(n, device=device)
        self.next_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.probs = torch.empty(n, cfg.vocab_size, device=device)
        self.noise: Optional[torch.Tensor] = None
        self.finished_cpu = torch.zeros(n, dtype=torch.bool, pin_memory=True)
        self.done_event = torch.cuda.Event()
    def sample(self, logits: torch.Tensor) -> List[int]:
        batch, bs = current_batch(), logits.shape[0]
        temps = self.temperatures[:bs]
        if not any(temps):  # expect: FC101
            self.next_ids = logits.new_empty(bs, dtype=torch.int64)  # expect: FC107
            torch.argmax(logits, dim=-1, out=self.next_ids)
        else:
            self.probs.resize_(bs, logits.shape[-1])  # expect: FC107
            self.probs.copy_(torch.softmax(logits / temps.clamp(min=1e-5)[:, None], dim=-1))
            if self.noise is None:
                self.noise = torch.empty_like(self.probs)  # ok: FC107
            self.next_ids[:bs] = (self.probs / self.noise[:bs].exponential_()).argmax(-1)
        next_ids = torch.where(batch.seq_lens >= self.cfg.context_len, self.cfg.eos_token_id, self.next_ids[:bs])  # ok: FC101
        if self.finished_cpu.numel() < bs:  # ok: FC101
            self.finished_cpu = torch.zeros(bs, dtype=torch.bool, pin_memory=True)  # ok: FC107
        self.finished_cpu[:bs].copy_(next_ids == self.cfg.eos_token_id, non_blocking=True)  # ok: FC101
        self.done_event.record()
        logger.debug("finished slots %s", batch.req_pool_indices[next_ids == self.cfg.eos_token_id])  # expect: FC101
        return next_ids.tolist()  # expect: FC101
    def poll_finished(self) -> List[bool]:
        """Detokenizer thread: the finished flags of the last step, once their copy has landed."""
        self.done_event.synchronize()  # ok: FC101
        return self.finished_cpu.tolist()

class CudaGraphRunner:
    def __init__(self, cfg: ServeConfig, model: DecoderModel, backend: FlashInferAttnBackend, device: torch.device):
        self.cfg, self.model, self.backend, self.device = cfg, model, backend, device
        self.buckets = [b for b in GRAPH_BUCKETS if b <= cfg.max_running_requests]
        self.graphs: Dict[int, GraphState] = {}
        self.metas: Dict[int, ForwardMetadata] = {}
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_caches: List[torch.Tensor] = []
        self.sampler = Sampler(cfg, device)
        self.tokens_served = 0
    def capture(self, kv_caches: List[torch.Tensor]):
        self.kv_caches = kv_caches
        self.backend.init_cuda_graph_state(self.buckets)
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101
    def capture_one_batch_size(self, bs: int):
        b = self.backend
        dummy = ForwardBatch(True, bs, self.input_ids[:bs], self.positions[:bs], self.seq_lens[:bs],
                             torch.ones(bs, dtype=torch.int32), torch.arange(bs, device=self.device), b.kv_indptr[: bs + 1],
                             b.kv_indptr_cpu[: bs + 1], b.kv_indices, b.kv_last_page_len[:bs], b.kv_last_page_len_cpu[:bs])
        state = self.graphs[bs] = GraphState(torch.cuda.CUDAGraph(), bs, self.input_ids[:bs], self.positions[:bs])
        with step_context(dummy), capture_mode(state):
            meta = self.metas[bs] = b.init_forward_metadata_capture_cuda_graph(bs)
            token = CURRENT_META.set(meta)
            try:
                b.plan_window()
                b.plan_chunk()
                b.plan_shared_prefix()
                b.trtllm.plan_capture(bs)
                b.trtllm.plan_draft()
                if getattr(meta.decode_wrapper, "_cached_module", None) is None:  # expect: FC103
                    logger.warning("bucket %d: decode kernels not JIT-compiled before capture", bs)
                state.logits = torch.empty(bs, self.cfg.vocab_size, device=self.device)  # ok: FC107
                with torch.cuda.graph(state.graph):
                    hidden = self.model.forward_decode(state.input_ids, state.positions, self.kv_caches)
                    hidden = self.model.forward_draft(hidden, state.positions, self.kv_caches[-1])
                    state.logits.copy_(self.model.compute_logits(hidden))
            finally:
                CURRENT_META.reset(token)
    def replay(self) -> List[int]:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        batch = current_batch()
        raw_bs = len(batch.seq_lens_cpu)  # ok: FC101
        bs = min(b for b in self.buckets if b >= raw_bs)  # ok: FC101
        state, meta = self.graphs[bs], self.metas[bs]
        graph_token, meta_token = CURRENT_GRAPH.set(state), CURRENT_META.set(meta)
        try:
            self._stage_inputs(raw_bs)
            self.backend.init_forward_metadata_replay_cuda_graph(bs)
            self.backend.trtllm.plan_draft()
            logger.debug("bucket %d replays a wrapper fixed to %d rows", bs, meta.decode_wrapper._fixed_batch_size)  # expect: FC103
            if not is_capturing():
                torch.cuda.synchronize()  # expect: FC101
            state.graph.replay()
            self.tokens_served += batch.seq_lens.sum().item()  # expect: FC101
            self.last_logits = state.logits[:raw_bs].clone()  # expect: FC107
            return self.sampler.sample(state.logits[:raw_bs])
        finally:
            CURRENT_META.reset(meta_token)
            CURRENT_GRAPH.reset(graph_token)
    def _stage_inputs(self, raw_bs: int):
        batch = current_batch()
        state: GraphState = CURRENT_GRAPH.get()
        _check_staging()
        state.input_ids[:raw_bs].copy_(batch.input_ids)  # ok: FC104
        state.positions = torch.cat([batch.positions, state.positions[raw_bs:]])  # expect: FC107
        self.seq_lens[:raw_bs].copy_(batch.seq_lens)
        host_staging()["seq_lens"][:raw_bs].copy_(batch.seq_lens)  # expect: FC101

def _check_staging():
    assert "seq_lens" in host_staging(), "the model runner allocates the staging tensors"  # ok: FC109
