"""Worker: the object every string-named RPC lands on."""

from __future__ import annotations

import logging

import torch

from .config import EngineConfig
from .model_runner import ModelRunner, ModelRunnerOutput
from .rpc import run_method
from .sampler import SamplerOutput

logger = logging.getLogger(__name__)


class Worker:
    def __init__(self, cfg: EngineConfig, rank: int, local_rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.local_rank = local_rank
        self.device = torch.device("cuda", local_rank)
        self.model_runner: ModelRunner | None = None
        self._tokens_since_log = 0

    # ---- set-up RPCs -------------------------------------------------------------------------

    def init_device(self) -> None:
        torch.cuda.set_device(self.device)
        torch.cuda.empty_cache()

    def load_model(self) -> None:
        self.model_runner = ModelRunner(self.cfg, self.device)
        self.model_runner.load_model()

    def determine_num_available_pages(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        budget = int(total * self.cfg.gpu_memory_utilization) - (total - free)
        cfg = self.cfg
        page_bytes = 2 * cfg.page_size * cfg.num_kv_heads * cfg.head_dim * 2 * cfg.num_layers
        return max(budget // page_bytes, cfg.max_num_seqs)

    def initialize_cache(self, num_pages: int) -> None:
        self.model_runner.attn_backend.allocate_kv_cache(num_pages)

    def compile_or_warm_up_model(self) -> None:
        if self.cfg.enforce_eager:
            return
        run_method(self.model_runner, "capture_model")

    # ---- per-step RPCs -----------------------------------------------------------------------

    def execute_model(self, sched_out) -> ModelRunnerOutput:
        assert sched_out.num_reqs <= self.cfg.max_num_seqs, sched_out.num_reqs  # expect: FC109
        return self.model_runner.step(sched_out)

    def sample_tokens(self, model_out: ModelRunnerOutput) -> SamplerOutput:
        return self.model_runner.sample(model_out)

    def record_step_stats(self, step: int) -> None:
        stats = self.model_runner.last_step_stats
        if stats is None:
            return
        self._tokens_since_log += stats.num_tokens
        logger.debug("step %d: %s requests hit EOS", step, stats.num_eos)  # ok: FC101
        if step % self.cfg.log_every_n_steps == 0:
            logger.info(f"step {step}: {self._tokens_since_log} tokens, {stats.num_eos} finished by EOS")  # expect: FC101
            self._tokens_since_log = 0

    # ---- admin RPCs (GET /debug/<name>) ------------------------------------------------------

    def dump_kv_stats(self) -> dict[str, list[int]]:
        backend = self.model_runner.attn_backend
        return {
            "kv_indptr": backend.kv_indptr.tolist(),  # ok: FC101
            "kv_last_page_len": backend.kv_last_page_len_cpu.tolist(),
        }

    def get_memory_stats(self) -> dict[str, int]:
        backend = self.model_runner.attn_backend
        stats = {"kv_cache": sum(2 * k.numel() * k.element_size() for k, _ in backend.kv_caches)}
        for name in ("decode_wrapper", "prefill_wrapper", "verify_wrapper"):
            wrapper = getattr(backend, name)
            stats[name] = wrapper._float_workspace_buffer.numel()  # expect: FC103
        stats["allocated"] = torch.cuda.memory_allocated(self.device)
        return stats

    def check_health(self) -> bool:
        return self.model_runner is not None and self.model_runner.model is not None

    def shutdown(self) -> None:
        self.model_runner = None
        torch.cuda.empty_cache()
