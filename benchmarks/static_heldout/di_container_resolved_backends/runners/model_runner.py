"""The step loop, and the composition root: the only place that names concrete classes."""
import math
import torch
from backends_ext.trtllm_gen import TrtllmGenBackend
from diengine import AttentionBackend, Container, EngineConfig, KVPool, WorkspaceProvider
from diengine.batch import ForwardBatch
from diengine.flashinfer_backend import FlashInferBackend
from diengine.memory import PagedKVPool, SharedWorkspaces
from runners.graph_runner import GraphRunner
from runners.model import DecoderModel


class ModelRunner:
    def __init__(self, config: EngineConfig, backend: AttentionBackend, model: DecoderModel, graph_runner: GraphRunner):
        self.cfg, self.device = config, torch.device(config.device)
        self.backend, self.model, self.graph_runner = backend, model, graph_runner
        self.ids_pinned = torch.zeros(config.max_num_tokens, dtype=torch.int64, pin_memory=True)
        self.logits_buf = None
        self.copy_event = torch.cuda.Event()

    def prepare_batch(self, reqs) -> ForwardBatch:
        bs = len(reqs)
        page = self.cfg.page_size
        is_decode = all(r.is_decode for r in reqs)
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        extend_lens_cpu = torch.tensor([r.extend_len for r in reqs], dtype=torch.int32)
        prefix_lens_cpu = seq_lens_cpu - extend_lens_cpu
        kv_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_cpu[1:] = torch.cumsum((seq_lens_cpu + page - 1) // page, 0)
        qo_indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr_cpu[1:] = torch.cumsum(extend_lens_cpu, 0)
        last_page_len_cpu = (seq_lens_cpu - 1) % page + 1
        if math.ceil(int(seq_lens_cpu.max()) / page) > self.cfg.max_context // page:  # ok: FC101
            raise ValueError("request longer than max_context")
        kv_indices_cpu = torch.cat([r.page_table for r in reqs])
        num_tokens = int(extend_lens_cpu.sum())  # ok: FC101
        if self.ids_pinned.numel() < num_tokens:
            self.ids_pinned = torch.zeros(num_tokens, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.ids_pinned[:num_tokens].copy_(torch.cat([r.new_token_ids for r in reqs]))  # ok: FC101
        spans = zip(prefix_lens_cpu.tolist(), seq_lens_cpu.tolist())  # ok: FC101
        self.positions_cpu = torch.cat([torch.arange(p, s) for p, s in spans])  # ok: FC107
        pool_idx_cpu = torch.tensor([r.pool_idx for r in reqs])
        out_loc_cpu = torch.cat([r.out_locs for r in reqs])
        d = self._to_device
        return ForwardBatch(is_decode, bs, num_tokens, d(self.ids_pinned[:num_tokens]), d(self.positions_cpu),
                            d(seq_lens_cpu), seq_lens_cpu, d(extend_lens_cpu), extend_lens_cpu, d(prefix_lens_cpu),
                            qo_indptr_cpu, d(kv_indptr_cpu), kv_indptr_cpu, d(kv_indices_cpu), d(last_page_len_cpu),
                            last_page_len_cpu, d(pool_idx_cpu), d(out_loc_cpu))

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, non_blocking=True)

    def execute_step(self, reqs):
        assert self.graph_runner.max_bs <= self.cfg.max_bs  # ok: FC109
        fb = self.prepare_batch(reqs)
        if fb.is_decode and fb.batch_size <= self.graph_runner.max_bs:  # ok: FC101
            self.graph_runner.seq_lens_buf = fb.seq_lens.clone()  # expect: FC107
            logits = self.graph_runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model(fb)
        n = logits.shape[0]
        if self.logits_buf is None or self.logits_buf.shape[0] < n:
            self.logits_buf = torch.empty(n, logits.shape[1], dtype=logits.dtype, device=self.device)  # expect: FC107
        self.logits_buf[:n].copy_(logits)
        self.copy_event.record()
        torch.cuda.current_stream().wait_event(self.copy_event)  # ok: FC101
        torch.cuda.synchronize()  # expect: FC101
        return self.logits_buf[:n].argmax(-1)

    def reset_after_error(self) -> None:
        self.backend.kv_indptr.zero_()  # expect: FC104
        self.graph_runner.graphs.clear()

def build_container(config: EngineConfig) -> Container:
    c = Container(config)
    c.register(WorkspaceProvider, SharedWorkspaces)
    c.register(KVPool, PagedKVPool)
    c.register(AttentionBackend, TrtllmGenBackend if config.attention_backend == "trtllm" else FlashInferBackend)
    c.register_factory(DecoderModel, lambda ct: DecoderModel(config, ct.resolve(AttentionBackend)).to(config.device))
    c.freeze()
    return c

def build_engine(config: EngineConfig) -> ModelRunner:
    container = build_container(config)
    runner = container.resolve(ModelRunner)
    runner.graph_runner.capture()
    return runner
