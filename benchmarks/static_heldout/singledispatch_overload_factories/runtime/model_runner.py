"""The step loop: decode buckets replay one CUDA graph each, every other batch goes through ``build_metadata``."""
import logging

import torch
from flashinfer.rope import apply_rope_pos_ids

from attention.dispatch import Backend, build_metadata, make_backend, prepare_graph_inputs, run_attention
from attention.factories import DecodeMeta
from sdengine.batches import DecodeBatch
from sdengine.config import DECODE_BUCKETS, EngineConfig

logger = logging.getLogger(__name__)


def decoder_forward(model: torch.nn.Module, backend: Backend, input_ids: torch.Tensor, meta) -> torch.Tensor:
    h = model.embed_tokens(input_ids)
    for layer_id, layer in enumerate(model.layers):
        q, k, v = layer.qkv_proj(h)
        if isinstance(meta, DecodeMeta) and meta.seq_lens is not None:
            q, k = apply_rope_pos_ids(q, k, meta.seq_lens - 1)
        h = layer.mlp(h + run_attention(meta, backend, q, k, v, layer.kv_cache, layer_id).flatten(1))
    return h


class BucketGraphRunner:
    _CLONED_INPUTS = ("seq_lens",)

    def __init__(self, model: torch.nn.Module, backend: Backend, cfg: EngineConfig, device: torch.device):
        self.model, self.backend, self.cfg, self.device = model, backend, cfg, device
        self.buckets, self.max_bs = cfg.decode.buckets, cfg.decode.buckets[-1]
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static_out: dict[int, torch.Tensor] = {}
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        backend.init_cuda_graph_wrappers(self.buckets)
        for bs, w in backend.graph_wrappers.items():
            if not w.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper was built outside graph mode")

    def capture_all(self) -> None:
        assert not self.graphs, "buckets were already captured"  # ok: FC109
        assert DECODE_BUCKETS == tuple(sorted(DECODE_BUCKETS)), "buckets must be sorted"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            if getattr(self.backend.graph_wrappers[bs], "_fixed_batch_size", bs) != bs:  # expect: FC103
                raise RuntimeError(f"graph wrapper for bucket {bs} was planned for another batch size")
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        meta = self.backend.plan_capture(bs)
        meta.seq_lens, ids = self.seq_lens[:bs], self.static_input_ids[:bs]
        decoder_forward(self.model, self.backend, ids, meta)  # eager warm-up: JIT and autotune outside the capture
        torch.cuda.synchronize()  # ok: FC101
        self.static_out[bs] = torch.empty(bs, self.model.config.hidden_size, device=self.device)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            h = decoder_forward(self.model, self.backend, ids, meta)
            if self.cfg.trtllm.num_draft_tokens and hasattr(self.backend, "forward_draft"):
                q, k, v = self.model.mtp.qkv_proj(h)
                h = self.backend.forward_draft(meta, q, k, v, self.model.mtp.kv_cache).flatten(1)
            logger.debug("captured bucket %d, |h|=%.3f", bs, h.norm().item())  # expect: FC101
            self.static_out[bs].copy_(h)
        self.graphs[bs] = g

    def prepare_replay(self, batch: DecodeBatch, bs: int) -> None:
        n = batch.batch_size
        if int(batch.kv_indptr[-1]) > self.backend.kv_indices_buf.numel():  # expect: FC101
            raise RuntimeError(f"batch needs more pages than the graph index buffer: {batch.kv_indptr}")  # ok: FC101
        prepare_graph_inputs(batch, self.backend, bs)
        self.static_input_ids[:n].copy_(batch.input_ids)  # ok: FC104
        for name in self._CLONED_INPUTS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107

    def replay(self, batch: DecodeBatch) -> torch.Tensor:
        n = batch.batch_size
        assert n <= self.max_bs, f"batch of {n} rows exceeds the largest bucket"  # expect: FC109
        bs = min(b for b in self.buckets if b >= n)  # ok: FC101
        self.prepare_replay(batch, bs)
        self.backend.last_page_len_buf[n:bs].fill_(1)  # expect: FC104
        self.graphs[bs].replay()
        logger.info("replayed bucket %d, longest sequence %d" % (bs, batch.seq_lens.max()))  # expect: FC101
        return self.static_out[bs][:n]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, cfg: EngineConfig, device: str = "cuda"):
        self.model, self.cfg, self.device = model, cfg, torch.device(device)
        self._use_cuda_graph = cfg.use_cuda_graph  # ok: FC103
        self.backend = make_backend(cfg.trtllm if cfg.use_trtllm_decode else cfg.decode, cfg, self.device)
        self.graph_runner = BucketGraphRunner(model, self.backend, cfg, self.device) if self._use_cuda_graph else None
        self.sampling_workspace = torch.empty(cfg.decode.max_batch_size * cfg.vocab_size * 4, dtype=torch.uint8, device=self.device)  # ok: FC106
        scratch_workspace = torch.empty(16 << 20, dtype=torch.uint8, device=self.device)  # ok: FC106
        torch.ops.sd_kernels.autotune_sampler(scratch_workspace, cfg.vocab_size)
        self.logits_buf: torch.Tensor | None = None
        self.upload_stream = torch.cuda.Stream()
        self.eos_id, self.num_accepted = 2, 0
        if self.graph_runner is not None:
            self.graph_runner.capture_all()

    def execute_step(self, batch, draft_ids: torch.Tensor | None = None) -> list[int]:
        assert self.graph_runner is None or self.graph_runner.backend is self.backend  # ok: FC109
        torch.cuda.current_stream().wait_stream(self.upload_stream)  # ok: FC101
        runner = self.graph_runner
        if runner is not None and isinstance(batch, DecodeBatch) and batch.batch_size <= runner.max_bs:
            h = runner.replay(batch)
        else:
            if isinstance(batch, DecodeBatch):
                self._ensure_capacity(int(batch.kv_indptr_cpu[-1]))  # ok: FC101
            h = decoder_forward(self.model, self.backend, batch.input_ids, build_metadata(batch, self.backend))
        if self.logits_buf is None:
            self.logits_buf = torch.empty(self.cfg.prefill.max_num_tokens, self.cfg.vocab_size, device=self.device)  # ok: FC107
        logits = torch.matmul(h, self.model.embed_tokens.weight.t(), out=self.logits_buf[: h.shape[0]])
        torch.ops.sd_kernels.top_k_top_p_renorm_(logits, self.sampling_workspace)
        next_ids = torch.argmax(logits, dim=-1)
        if draft_ids is not None:
            match = torch.where(draft_ids == next_ids[: draft_ids.shape[0], None], 1, 0)  # ok: FC101
            self.advance_after_accept(match.cumprod(1).sum(1), draft_ids.shape[0])
        self.last_finished = torch.nonzero(next_ids == self.eos_id).flatten()  # expect: FC101
        torch.cuda.synchronize()  # expect: FC101
        return next_ids.tolist()  # expect: FC101

    def _ensure_capacity(self, total_pages: int) -> None:
        if total_pages > self.backend.kv_indices_buf.numel():
            self.backend.kv_indices_buf.resize_(total_pages)  # expect: FC107

    def advance_after_accept(self, accept_lens: torch.Tensor, n: int) -> None:
        self.num_accepted += int(accept_lens.sum())  # expect: FC101
        self.backend.kv_indptr_buf[1 : n + 1] += torch.cumsum(accept_lens, 0).to(torch.int32)  # expect: FC104

    def on_pages_moved(self, remap: torch.Tensor, freed: slice) -> None:
        self.backend.kv_indices_buf[freed] = 0  # expect: FC104
        self.backend.kv_indices_buf.copy_(remap[self.backend.kv_indices_buf.long()])  # expect: FC104

    def reset_after_error(self) -> torch.Tensor:
        offsets = self.backend.kv_indptr_buf.clone()  # kept for the crash report, relative to the first row
        offsets.sub_(offsets[0].clone())  # ok: FC104
        self.backend.last_page_len_buf.fill_(1)  # expect: FC104
        return offsets
