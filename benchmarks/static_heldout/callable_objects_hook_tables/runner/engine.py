"""Graph runner with pre-/post-replay hook lists, callable step objects and the engine's step table."""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

import torch
from flashcheck import hot_path

from attn.backend import FlashInferHookedBackend
from attn.trtllm_gen import TrtllmDraft, TrtllmGenDecode
from hookserve.batch import ForwardBatch, ReplayMeta
from hookserve.config import ServeConfig
from hookserve.hooks import AcceptStats, LoraSlotHook, make_accept_hook
from runner.model import HookedModel

logger = logging.getLogger(__name__)


def _check_bucket(bs: int, buckets: Tuple[int, ...]) -> None:
    assert bs in buckets, f"batch size {bs} is not a decode bucket"  # expect: FC109


def _check_hook_count(num_hooks: int) -> None:
    assert num_hooks < 32, "runaway hook registration"  # ok: FC109


class CudaGraphRunner:
    def __init__(self, cfg: ServeConfig, backend: FlashInferHookedBackend, forward_fn: Callable[..., torch.Tensor], device) -> None:
        self.cfg, self.backend, self.forward_fn = cfg, backend, forward_fn
        self._pre_replay_hooks: List[Callable[[ReplayMeta], None]] = []
        self._post_replay_hooks: List[Callable[[ReplayMeta, torch.Tensor], None]] = []
        self.static_ids = torch.zeros(cfg.decode_buckets[-1], dtype=torch.int64, device=device)
        self.static_out: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.last_logits: Optional[torch.Tensor] = None

    def register_pre_replay_hook(self, fn: Callable[[ReplayMeta], None]) -> None:
        assert callable(fn), f"pre-replay hook {fn!r} is not callable"  # expect: FC109
        self._pre_replay_hooks.append(fn)

    def register_post_replay_hook(self, fn: Callable[[ReplayMeta, torch.Tensor], None]) -> None:
        self._post_replay_hooks.append(fn)

    def record_logits(self, meta: ReplayMeta, logits: torch.Tensor) -> None:  # post-replay hook
        setattr(self, "last_logits", logits.clone())  # expect: FC107

    def capture(self) -> None:
        assert not self.graphs, "capture() runs once per engine"  # ok: FC109
        _check_hook_count(len(self._pre_replay_hooks) + len(self._post_replay_hooks))
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.decode_buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        _check_bucket(bs, self.cfg.decode_buckets)
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids = self.static_ids[:bs]
        self.static_out[bs] = torch.empty(bs, self.cfg.vocab_size, dtype=torch.float32, device=ids.device)  # ok: FC107
        self.forward_fn(ids)  # warm-up launch before the graph
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_out[bs].copy_(self.forward_fn(ids))
        self.graphs[bs] = graph

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture() must run before replay()"  # ok: FC109
        n = fb.batch_size
        bs = min(b for b in self.cfg.decode_buckets if b >= n)  # ok: FC101
        meta = ReplayMeta(bs, fb)
        self.static_ids[:n].copy_(fb.input_ids)  # ok: FC104
        for hook in self._pre_replay_hooks:
            hook(meta)
        self.graphs[bs].replay()
        logits = self.static_out[bs][:n]
        for hook in self._post_replay_hooks:
            hook(meta, logits)
        return logits


def make_graph_forward(model: HookedModel, backend: FlashInferHookedBackend) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(ids: torch.Tensor) -> torch.Tensor:  # what every bucket's graph captures
        return model(ids, backend)
    return forward


def make_compactor(backend: FlashInferHookedBackend) -> Callable[[torch.Tensor], None]:
    def compact(remap: torch.Tensor) -> None:  # defragmentation moved pages: rewrite the live page ids
        pages = backend.kv_indices
        pages.copy_(remap[pages.long()])  # expect: FC104
    return compact


def make_draft_step(backend: FlashInferHookedBackend, model: HookedModel, num_draft: int) -> Callable[[ForwardBatch], torch.Tensor]:
    assert num_draft > 0, "draft mode needs num_draft_tokens > 0"  # expect: FC109

    def step(fb: ForwardBatch) -> torch.Tensor:
        assert fb.mode == "draft", f"draft step got a {fb.mode} batch"  # expect: FC109
        backend.init_forward_metadata(fb)
        ids, tokens = fb.input_ids, []
        for _ in range(num_draft):
            ids = model.draft_logits(ids).argmax(dim=-1)
            tokens.append(ids)
        torch.cuda.synchronize()  # expect: FC101
        logger.debug("draft tokens %s", tokens)  # ok: FC101
        return torch.stack(tokens, dim=1)
    return step


class DecodeStep:
    def __init__(self, cfg: ServeConfig, backend: FlashInferHookedBackend, trtllm: TrtllmGenDecode, runner: CudaGraphRunner,
                 model: HookedModel, max_graph_bs: int, eos_id: int) -> None:
        assert max_graph_bs in cfg.decode_buckets, f"{max_graph_bs} is not a captured bucket"  # expect: FC109
        self.cfg, self.backend, self.trtllm, self.runner, self.model = cfg, backend, trtllm, runner, model
        self.max_graph_bs, self.eos_id = max_graph_bs, eos_id
        self.done_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.bool, pin_memory=True)

    def __call__(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.batch_size <= self.max_graph_bs:
            logits = self.runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            self.trtllm.step_batch = fb
            logits = self.model(fb.input_ids, self.backend)
        if torch.isinf(logits).all():  # expect: FC101
            raise FloatingPointError("all logits are inf in the decode step")
        next_ids = torch.where(torch.isnan(logits).any(-1), self.eos_id, logits.argmax(dim=-1))  # ok: FC101
        if getattr(self, "eos_rows", None) is None:
            self.eos_rows = torch.empty(self.cfg.max_batch_size, dtype=torch.bool, device=next_ids.device)  # ok: FC107
        torch.eq(next_ids, self.eos_id, out=self.eos_rows[: fb.batch_size])
        self.done_cpu[: fb.batch_size].copy_(self.eos_rows[: fb.batch_size], non_blocking=True)  # ok: FC101
        self.accept_mask = next_ids.new_zeros(fb.batch_size, dtype=torch.bool)  # expect: FC107
        # Each request grew by one token: advance the last-page lengths in place for the next step.
        self.backend.kv_last_page_len[: fb.batch_size].add_(1)  # expect: FC104
        self.backend.kv_last_page_cpu[: fb.batch_size].add_(1)  # ok: FC104
        return next_ids


class ExtendStep:
    def __init__(self, cfg: ServeConfig, backend: FlashInferHookedBackend, model: HookedModel, eos_id: int) -> None:
        self.cfg, self.backend, self.model, self.eos_id = cfg, backend, model, eos_id
        self.finished: List[torch.Tensor] = []
        self.prefix_hits: List[torch.Tensor] = []  # rows whose prompt hit the prefix cache

    def __call__(self, fb: ForwardBatch, max_extend: int) -> torch.Tensor:
        if max_extend > self.cfg.max_num_tokens:
            raise ValueError(f"extend chunk of {max_extend} tokens exceeds max_num_tokens")
        # The decode graphs' indptr is idle during an extend step: borrow it for the query offsets.
        qo_end = self.backend.kv_indptr[1 : fb.batch_size + 1]
        torch.cumsum(fb.extend_lens, 0, out=qo_end)  # expect: FC104
        starts = qo_end.clone()
        starts.sub_(fb.extend_lens)  # ok: FC104
        positions = torch.repeat_interleave(fb.seq_lens - fb.extend_lens - starts, fb.extend_lens, output_size=fb.num_tokens)  # ok: FC101
        positions += torch.arange(fb.num_tokens, device=positions.device)
        self.backend.init_forward_metadata(fb)
        logits = self.model.forward_extend(fb.input_ids, positions, self.backend)[fb.qo_indptr_cpu[1:].long() - 1]
        next_ids = logits.argmax(dim=-1)
        self.finished.append(fb.req_ids[next_ids == self.eos_id])  # expect: FC101
        self.prefix_hits.append(torch.where(fb.seq_lens > fb.extend_lens)[0])  # expect: FC101
        self.next_ids_cpu = torch.empty(fb.batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_ids_cpu.copy_(next_ids, non_blocking=True)  # ok: FC101
        return next_ids


class Engine:
    def __init__(self, cfg: ServeConfig, device: torch.device, kv_caches: List[torch.Tensor], eos_id: int) -> None:
        self.cfg, self.stats = cfg, AcceptStats()
        self.metrics: Dict[str, List[float]] = defaultdict(list)
        self.trtllm, self.draft = TrtllmGenDecode(cfg, device), TrtllmDraft(cfg, device)
        self.backend = FlashInferHookedBackend(cfg, device, self.trtllm, self.draft)
        self.model = HookedModel(cfg, self.draft, kv_caches, device)
        self.runner = CudaGraphRunner(cfg, self.backend, make_graph_forward(self.model, self.backend), device)
        lora = LoraSlotHook(self.model.slot_table, cfg.num_lora_slots)
        for hook in (lora, self.backend.plan_bucket, self.trtllm.pre_replay, lambda meta: self.draft.plan(meta.batch)):
            self.runner.register_pre_replay_hook(hook)
        self.runner.register_post_replay_hook(make_accept_hook(self.stats, cfg.num_draft_tokens))
        self.runner.register_post_replay_hook(self.backend.make_plan_probe())
        self.runner.register_post_replay_hook(self.runner.record_logits)
        self.runner.register_post_replay_hook(lambda meta, logits: self.metrics["max_len"].append(meta.batch.seq_lens.max().item()))  # expect: FC101
        self.runner.register_post_replay_hook(lambda meta, logits: self.metrics["host_max"].append(meta.batch.seq_lens_cpu.max().item()))  # ok: FC101
        self.decode_step = DecodeStep(cfg, self.backend, self.trtllm, self.runner, self.model, cfg.decode_buckets[-1], eos_id)
        self.extend_step = ExtendStep(cfg, self.backend, self.model, eos_id)
        self.compact = make_compactor(self.backend)
        self._steps: Dict[str, Callable[[ForwardBatch], torch.Tensor]] = {
            "decode": lambda fb: self.decode_step(fb),
            "extend": lambda fb: self.extend_step(fb, int(fb.extend_lens.max())),  # expect: FC101
            "draft": make_draft_step(self.backend, self.model, cfg.num_draft_tokens),
        }

    @hot_path
    def step(self, fb: ForwardBatch) -> torch.Tensor:
        return self._steps[fb.mode](fb)

    def abort_all(self) -> None:
        for task in ("reset_graph_pages", "reset_eager_indptr", "reset_trtllm_tail"):
            self.backend.maintain(task)
