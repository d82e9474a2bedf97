"""Model runner and the speculative engine loop."""
from __future__ import annotations

import argparse
import logging
import queue
import threading
from dataclasses import dataclass

import torch

from lrc_kernels.pages import PageCompactor
from lrc_kernels.sampling import Sampler

from . import envs, resources
from .attention import FlashInferDecodeBackend
from .config import EngineConfig, load_config
from .decorators import nvtx_range, phase_timer, retry_on_oom, step_timer, timing_summary
from .drafter import Drafter
from .forward_batch import ForwardBatch, ForwardMode, StepOutput
from .graph_runner import DecodeGraphRunner
from .model import LlamaForCausalLM, PagedKVPool

logger = logging.getLogger(__name__)


@dataclass
class Request:
    pool_idx: int
    seq_len: int
    last_token: int
    next_slot: int
    temperature: float = 1.0
    top_p: float = 1.0
    min_new_tokens: int = 0


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.req_to_page = torch.zeros(
            cfg.max_running_requests, cfg.max_pages_per_seq, dtype=torch.int32, device=device
        )
        self.kv_pool = PagedKVPool(cfg, device)
        self.attn_backend = FlashInferDecodeBackend(cfg, self.req_to_page, self.kv_pool, device)
        self.model = LlamaForCausalLM(cfg, self.attn_backend).to(device=device, dtype=cfg.dtype)
        self.sampler = Sampler(cfg.vocab_size, cfg.eos_token_id, device)
        self.graph_runner = DecodeGraphRunner(self)
        # sampler input buffers per (rows, dtype), made on first sight
        self._logits_bufs: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._next_tokens_host = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()

    @phase_timer("load weights")
    def load_model(self, path: str) -> None:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.model.load_state_dict(state, strict=False)

    @step_timer("forward")
    @nvtx_range("forward_step")
    def forward_step(self, fb: ForwardBatch) -> StepOutput:
        if fb.batch_size > self.cfg.max_batch_size:
            raise ValueError(f"batch of {fb.batch_size} rows over max_batch_size; seq_lens={fb.seq_lens}")  # ok: FC101
        logger.debug("forward_step %s seq_lens=%s", fb.forward_mode.name, fb.seq_lens)  # ok: FC101
        if self.graph_runner.can_run(fb):
            logits, hidden = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits, hidden = self.model(fb)
        next_tokens = self._sample(fb, logits)
        n = next_tokens.numel()
        if self._next_tokens_host.numel() < n:
            self._next_tokens_host = torch.empty(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        host_tokens = self._next_tokens_host[:n]
        host_tokens.copy_(next_tokens, non_blocking=True)  # ok: FC101
        self.copy_done.record()
        return StepOutput(logits=logits, hidden=hidden, next_tokens=next_tokens, host_tokens=host_tokens, done=self.copy_done)

    def _sample(self, fb: ForwardBatch, logits: torch.Tensor) -> torch.Tensor:
        key = (logits.shape[0], logits.dtype)
        buf = self._logits_bufs.get(key)
        if buf is None:
            buf = self._logits_bufs[key] = torch.empty(key[0], logits.shape[1], dtype=logits.dtype, device=self.device)  # ok: FC107
        buf.copy_(logits)
        if fb.forward_mode.is_target_verify():
            return self.sampler.sample_greedy(buf, fb.temperatures, fb.top_p)
        too_short = fb.seq_lens < fb.min_seq_lens if fb.min_seq_lens is not None else None
        return self.sampler.sample_random(buf, fb.temperatures, fb.top_p, too_short)


class SpecEngine:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.model_runner = ModelRunner(cfg, device)
        self.drafter = Drafter(cfg, self.model_runner.attn_backend, device)
        self.compactor = PageCompactor(self.model_runner.attn_backend, self.model_runner.req_to_page)
        self._finish_pending: list[torch.Tensor] = []
        self._outputs: queue.Queue = queue.Queue()
        self._output_thread = threading.Thread(target=self._drain_outputs, name="lrc-output", daemon=True)
        self.emitted: list[list[int]] = []

    # ---------------------------------------------------------------- lifecycle

    def _record_graphs(self) -> None:
        cfg = self.cfg
        rows = max(cfg.capture_sizes) * (cfg.num_draft_tokens + 1)
        envs.tune_graph_workspace(rows, cfg.num_qo_heads, cfg.head_dim, cfg.max_kv_splits)
        # a warm-up may have built the graph workspace at the placeholder size
        resources.graph_workspace.cache_clear()
        self.model_runner.graph_runner.capture()
        self.drafter.graph_runner.record_draft_graphs()

    def start(self) -> None:
        trt = self.model_runner.attn_backend.trtllm
        if trt is not None:
            trt.kernels()
        self._record_graphs()
        self._output_thread.start()

    def rebuild(self) -> None:
        """Weights reloaded: drop every cached resource and record the graphs again."""
        resources.rebuild_all()
        FlashInferDecodeBackend.graph_wrapper.cache_clear()
        self.drafter.__dict__.pop("graph_wrappers", None)
        self._record_graphs()

    # ---------------------------------------------------------------- scheduling

    def build_batch(self, reqs: list[Request], mode: ForwardMode = ForwardMode.DECODE) -> ForwardBatch:
        dev = self.device
        lens = [r.seq_len for r in reqs]
        min_lens = [r.seq_len - 1 + r.min_new_tokens for r in reqs]
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=dev),
            positions=torch.tensor([n - 1 for n in lens], dtype=torch.int64, device=dev),
            seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
            seq_lens_cpu=torch.tensor(lens, dtype=torch.int32),
            req_pool_indices=torch.tensor([r.pool_idx for r in reqs], dtype=torch.int64, device=dev),
            out_cache_loc=torch.tensor([r.next_slot for r in reqs], dtype=torch.int64, device=dev),
            temperatures=torch.tensor([r.temperature for r in reqs], dtype=torch.float32, device=dev),
            top_p=torch.tensor([r.top_p for r in reqs], dtype=torch.float32, device=dev),
            min_seq_lens=torch.tensor(min_lens, dtype=torch.int32, device=dev),
        )

    @retry_on_oom()
    def step(self, batch: ForwardBatch) -> torch.Tensor:
        draft = self.drafter.propose(batch)
        vbatch = self.drafter.make_verify_batch(batch, draft)
        out = self.model_runner.forward_step(vbatch)
        res = self.drafter.verify(vbatch, draft, out)
        self.drafter.extend_after_verify(vbatch, out)
        finished = (res.bonus_tokens == self.cfg.eos_token_id) | (
            batch.seq_lens + res.accept_lens + 1 >= self.cfg.max_context_len
        )
        if finished.any():  # expect: FC101
            self._finish_pending.append(finished)
        self._outputs.put((out.done, out.host_tokens, res.accept_lens))
        return res.bonus_tokens

    def compact_kv(self, free_mask_np) -> None:
        """Called by the scheduler between steps when the page pool is fragmented."""
        remap = torch.from_numpy(self.compactor.plan_moves(free_mask_np)).to(self.device)
        self.compactor.compact(remap)

    # ---------------------------------------------------------------- outputs / debug

    def _drain_outputs(self) -> None:
        while True:
            done, host_tokens, _accept_lens = self._outputs.get()
            done.synchronize()  # ok: FC101
            self.emitted.append(host_tokens.tolist())

    def dump_state(self) -> dict:
        be = self.model_runner.attn_backend
        return {
            "eager_pages": be.kv_indptr[-1].item(),  # ok: FC101
            "resource_caches": resources.cache_stats(),
            "wrapper_bytes": resources.wrapper_memory_bytes([be.decode_wrapper, be.window_wrapper]),
            "timings": timing_summary(),
            "env": envs.snapshot(),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lrcserve speculative decode engine")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dump", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    cfg = load_config(args.model)
    engine = SpecEngine(cfg, torch.device("cuda", 0))
    engine.model_runner.load_model(args.model)
    engine.start()
    if args.dump:
        print(engine.dump_state())


if __name__ == "__main__":
    main()
