"""Model runner: builds the backend, model, sampler, drafter and graphs; runs one step."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from descserve_kernels.paged_ops import KVCompactor, PagedKVPool

from . import config as engine_config
from .attn_base import AttnBackendBase
from .config import EngineConfig
from .descriptors import DeviceBuffer, HostView, PinnedMirror
from .drafter import EagleDrafter
from .flashinfer_backend import FlashInferAttnBackend
from .forward_batch import ForwardBatch, ForwardMode, ScheduledBatch
from .graph_runner import CudaGraphRunner
from .trtllm_backend import TrtllmDecodeBackend

logger = logging.getLogger(__name__)

BACKENDS = {"flashinfer": FlashInferAttnBackend, "trtllm": TrtllmDecodeBackend}


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0):
    head_dim = q.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., ::2].float(), x[..., 1::2].float()
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).to(x.dtype)

    return rot(q), rot(k)


class AttentionLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: EngineConfig, backend: AttnBackendBase) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        windowed = cfg.sliding_window_every > 0 and layer_id % cfg.sliding_window_every == 0
        self.sliding_window = cfg.sliding_window if windowed else -1
        self.scaling = cfg.head_dim**-0.5
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.backend = backend

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = h.shape[0]
        q, k, v = self.qkv_proj(self.norm(h)).split(
            [self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], dim=-1
        )
        q = q.view(n, self.num_qo_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        q, k = apply_rotary(q, k, fb.positions)
        out = self.backend.forward(q, k, v.view(n, self.num_kv_heads, self.head_dim), self, fb)
        return self.o_proj(out.reshape(n, -1))


class DecoderModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: AttnBackendBase) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttentionLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(fb.input_ids)
        for layer in self.layers:
            h = h + layer(h, fb)
        return self.lm_head(self.norm(h))


class Sampler:
    # Per-row sampling state; rows follow the persistent batch order the scheduler keeps.
    temperatures = DeviceBuffer(lambda o: o.max_bs, torch.float32, fill=1.0)
    temperatures_cpu = PinnedMirror(lambda o: o.max_bs, torch.float32)
    temperatures_np = HostView("temperatures_cpu")
    bias_mask = DeviceBuffer(lambda o: (o.max_bs, o.vocab_size), torch.bool, fill=False)
    bias_values = DeviceBuffer(lambda o: (o.max_bs, o.vocab_size), torch.float32, fill=0.0)
    ban_mask = DeviceBuffer(lambda o: (o.max_bs, o.vocab_size), torch.bool, fill=False)

    def __init__(self, max_bs: int, vocab_size: int, device: torch.device) -> None:
        self.max_bs = max_bs
        self.vocab_size = vocab_size
        self.device = device
        self.has_bias = False

    # -- request admission (not per step) ------------------------------------------------

    def set_logit_bias(self, row: int, token_ids: Sequence[int], values: Sequence[float]) -> None:
        ids = torch.tensor(token_ids, dtype=torch.int64, device=self.device)
        self.bias_mask[row].zero_()
        self.bias_mask[row, ids] = True
        self.bias_values[row, ids] = torch.tensor(values, dtype=torch.float32, device=self.device)
        self.has_bias = True

    def ban_tokens(self, row: int, token_ids: Sequence[int]) -> None:
        self.ban_mask[row, torch.tensor(token_ids, dtype=torch.int64, device=self.device)] = True

    # -- per step ---------------------------------------------------------------------------

    def sample(self, logits: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        bs = fb.batch_size
        self.temperatures_np[:bs] = fb.sampling_temps
        self.temperatures[:bs].copy_(self.temperatures_cpu[:bs], non_blocking=True)
        logits = logits[:bs].float()
        if self.has_bias:
            mask = self.bias_mask[:bs]
            logits[mask] = logits[mask] + self.bias_values[:bs][mask]  # expect: FC101
        logits[self.ban_mask[:bs]] = float("-inf")  # ok: FC101
        temps = self.temperatures[:bs]
        greedy = logits.argmax(dim=-1)
        scaled = logits / torch.where(temps > 0, temps, torch.ones_like(temps)).unsqueeze(-1)  # ok: FC101
        sampled = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)
        return torch.where(temps > 0, sampled, greedy)


class StepStats:
    __slots__ = ("steps", "tokens", "kv_pages")

    def __init__(self) -> None:
        self.steps = 0
        self.tokens = 0
        self.kv_pages = 0

    def observe(self, seq_lens_snapshot: torch.Tensor) -> None:
        self.steps += 1
        self.tokens += int(seq_lens_snapshot.sum())  # ok: FC101


class ModelRunner:
    # Scheduler token ids are staged here, then copied to the device once per step.
    input_ids_cpu = PinnedMirror(lambda o: o.cfg.max_num_tokens, torch.int64)
    input_ids_np = HostView("input_ids_cpu")

    def __init__(self, cfg: EngineConfig, device: str = "cuda") -> None:
        engine_config.tune_workspaces(cfg)
        self.cfg = cfg
        self.device = torch.device(device)
        self.max_running = cfg.max_running_requests
        self.kv_pool = PagedKVPool(
            cfg.num_layers, cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, self.device
        )
        self.req_to_page = torch.zeros(
            cfg.max_running_requests, cfg.max_pages_per_req, dtype=torch.int32, device=self.device
        )
        self.attn_backend: AttnBackendBase = BACKENDS[cfg.attention_backend](
            cfg, self.kv_pool, self.req_to_page, self.device
        )
        self.model = DecoderModel(cfg, self.attn_backend).to(self.device, dtype=torch.bfloat16)
        self.sampler = Sampler(self.attn_backend.max_bs, cfg.vocab_size, self.device)
        self.drafter: Optional[EagleDrafter] = None
        if cfg.speculative_num_steps > 0:
            self.drafter = EagleDrafter(cfg, self.attn_backend, self.kv_pool, self.req_to_page, self.device)
        self.compactor = KVCompactor(self.kv_pool, self.req_to_page)
        self.stats = StepStats()
        self.graph_runner: Optional[CudaGraphRunner] = None
        if cfg.cuda_graph_max_bs > 0:
            self.graph_runner = CudaGraphRunner(self)
            self.graph_runner.capture()

    # -- the step -----------------------------------------------------------------------------

    def forward_step(self, sched: ScheduledBatch) -> List[int]:
        n_tokens = len(sched.input_ids)
        if n_tokens > self.input_ids_cpu.shape[0]:
            ModelRunner.input_ids_cpu.grow(self, n_tokens)
        self.input_ids_np[:n_tokens] = sched.input_ids
        fb = ForwardBatch.from_schedule(sched, self.input_ids_cpu[:n_tokens], self.device)
        if fb.batch_size > self.max_running:
            logger.warning(f"step over the running limit ({fb.batch_size} > {self.max_running}): seq_lens={fb.seq_lens}")  # expect: FC101
        self.stats.observe(fb.seq_lens_host)
        if self.compactor.pending:
            self.compactor.apply_remap()

        replayed = False
        if fb.forward_mode.is_decode() and self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
            replayed = True
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb)[fb.logits_index]

        next_ids = self.sampler.sample(logits, fb)
        next_ids_cpu = next_ids.tolist()  # expect: FC101
        if self.drafter is not None:
            self.drafter.propose(fb, logits, next_ids, drafted=replayed)
        return next_ids_cpu

    # -- start-up and admin -------------------------------------------------------------------

    def warmup(self) -> None:
        """One dummy decode step, so that FlashInfer compiles its kernels before serving."""
        bs = 1
        sched = ScheduledBatch(
            forward_mode=ForwardMode.DECODE,
            input_ids=[0] * bs,
            req_pool_indices=list(range(bs)),
            seq_lens=[1] * bs,
            extend_lens=[1] * bs,
            out_cache_loc=[0] * bs,
            temperatures=[0.0] * bs,
        )
        self.forward_step(sched)
        torch.cuda.synchronize(self.device)
        backend = self.attn_backend
        if isinstance(backend, FlashInferAttnBackend):
            if backend.decode_module is None:
                logger.warning("decode kernels were not compiled during warm-up")
            logger.info("decode plan after warm-up: %s", backend.decode_plan_info)

    def memory_report(self) -> Dict[str, int]:
        backend = self.attn_backend
        workspace = backend.float_workspace
        kv_bytes = sum(t.numel() * t.element_size() for t in self.kv_pool.kv)
        return {
            "float_workspace_bytes": workspace.numel() * workspace.element_size(),
            "kv_cache_bytes": kv_bytes,
            "graphs": len(self.graph_runner.graphs) if self.graph_runner is not None else 0,
        }

    def dump_debug_state(self) -> Dict[str, object]:
        """Admin endpoint (``/debug/page_table``); never called on the step path."""
        backend = self.attn_backend
        bs = backend._active_bs
        return {
            "kv_indptr": backend.kv_indptr[: bs + 1].cpu().tolist(),
            "stats": {"steps": self.stats.steps, "tokens": self.stats.tokens},
        }

    def handle_admin(self, command: str) -> Dict[str, object]:
        if command == "memory":
            return dict(self.memory_report())
        if command == "page_table":
            return self.dump_debug_state()
        raise ValueError(f"unknown admin command {command!r}")
