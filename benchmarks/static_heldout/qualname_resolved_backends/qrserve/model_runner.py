"""GPU model runner: the composition root.

Every component is found by name at start-up:

* the attention backend: ``getattr(importlib.import_module(cfg.backend_module), cfg.backend_cls)``;
* its metadata builder: ``attn_backend.get_builder_cls()`` (a qualified name on the backend class);
* the model: ``MODEL_REGISTRY[cfg.architecture]``;
* the graph wrapper and the sampler: ``qualnames_for(cfg.platform, cfg.mode)``, built by ``instantiate``;
* the block table and the page compactor: ``get_kv_helper_cls(...)``.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from qrserve.attention.abstract import CommonAttentionMetadata
from qrserve.config import MODEL_REGISTRY, EngineConfig, qualnames_for
from qrserve.sampler import SamplerOutput, SamplingMetadata
from qrserve.utils import cdiv, get_kv_helper_cls, instantiate, resolve_obj_by_qualname

logger = logging.getLogger(__name__)

_SAMPLING_EPS = 1e-5


@dataclass
class SchedulerOutput:
    req_rows: list[int]  # persistent-batch row of each scheduled request, decodes first
    num_scheduled_tokens: list[int]
    num_computed_tokens: list[int]
    token_ids: list[list[int]]
    new_block_ids: dict[int, list[int]] = field(default_factory=dict)
    block_moves: list[tuple[int, int]] = field(default_factory=list)
    common_prefix_len: int = 0


class GPUModelRunner:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        table = qualnames_for(cfg.platform, cfg.mode)

        backend_module = importlib.import_module(cfg.backend_module)
        self.attn_backend = getattr(backend_module, cfg.backend_cls)
        builder_cls = self.attn_backend.get_builder_cls()
        self.attn_metadata_builder = builder_cls(cfg, device, table)

        model_cls = resolve_obj_by_qualname(MODEL_REGISTRY[cfg.architecture])
        self._raw_model = model_cls(cfg, self.attn_backend, table).to(device=device, dtype=torch.bfloat16)
        self.model = instantiate(table["graph_wrapper"], self._raw_model, cfg, device)
        self.sampler = instantiate(table["sampler"], cfg)

        max_blocks = cdiv(cfg.max_model_len, cfg.page_size)
        block_table_cls = get_kv_helper_cls("block_table")
        self.block_table = block_table_cls(
            cfg.max_num_seqs, max_blocks // 4, cfg.max_num_batched_tokens, cfg.page_size, device, pin_memory=True
        )
        compactor_cls = get_kv_helper_cls("compactor")
        self.compactor = compactor_cls(
            self.block_table, self.attn_metadata_builder.paged_kv_indices, cfg.num_gpu_blocks, device
        )

        max_tokens, max_reqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int32, device=device)
        self.input_ids_cpu = torch.zeros(max_tokens, dtype=torch.int32, pin_memory=True)
        self.input_ids_np = self.input_ids_cpu.numpy()
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions_cpu = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=True)
        self.positions_np = self.positions_cpu.numpy()
        self.query_start_loc = torch.zeros(max_reqs + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(max_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.query_start_loc_np = self.query_start_loc_cpu.numpy()
        self.seq_lens = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_np = self.seq_lens_cpu.numpy()

        # sampling parameters of the persistent batch rows
        self.temperature = torch.ones(max_reqs, dtype=torch.float32, device=device)
        self.temperature_cpu = torch.ones(max_reqs, dtype=torch.float32, pin_memory=True)
        self.temperature_np = self.temperature_cpu.numpy()
        self.min_tokens = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.min_tokens_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.output_lens = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.output_lens_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.num_logprobs = torch.zeros(max_reqs, dtype=torch.int32, device=device)
        self.num_logprobs_cpu = torch.zeros(max_reqs, dtype=torch.int32, pin_memory=True)
        self.num_logprobs_np = self.num_logprobs_cpu.numpy()

        self.sampled_cpu = torch.zeros(max_reqs, dtype=torch.int64, pin_memory=True)
        self._sampled_ready = torch.cuda.Event()
        self._moves_cpu = torch.zeros(2, cfg.num_gpu_blocks, dtype=torch.int32, pin_memory=True)
        self._moves = torch.zeros(2, cfg.num_gpu_blocks, dtype=torch.int32, device=device)

    # -- start-up ------------------------------------------------------------------------------------------------

    def initialize_kv_cache(self) -> None:
        shape = self.attn_backend.get_kv_cache_shape(
            self.cfg.num_gpu_blocks, self.cfg.page_size, self.cfg.num_kv_heads, self.cfg.head_dim
        )
        for layer in self._raw_model.layers:
            layer.self_attn.kv_cache = torch.zeros(shape, dtype=torch.bfloat16, device=self.device)

    def profile_run(self) -> None:
        n = self.cfg.max_num_batched_tokens
        q = torch.randn(n, self.cfg.num_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        kv = torch.randn(n, self.cfg.num_kv_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=self.device)
        self.attn_metadata_builder.profile_prefill(q, kv, kv)
        torch.cuda.synchronize()

    def capture_model(self) -> None:
        if self.cfg.mode != "graph":
            return
        for bs in sorted(self.cfg.cudagraph_capture_sizes, reverse=True):
            common = self._dummy_common_metadata(bs)
            attn_metadata = self.attn_metadata_builder.build_for_cudagraph_capture(common)
            self.model.record(bs, self.input_ids[:bs], self.positions[:bs], attn_metadata)
        torch.cuda.synchronize()

    def workspace_report(self) -> dict[str, int]:
        """Bytes of FlashInfer float workspace per wrapper, for the memory report at start-up."""
        report: dict[str, int] = {}
        for name, wrapper in self.attn_metadata_builder.named_wrappers():
            float_ws = vars(wrapper).get("_float_workspace_buffer")  # expect: FC103
            if float_ws is not None:
                report[name] = float_ws.numel()
            report[f"{name}.cuda_graph"] = int(wrapper.is_cuda_graph_enabled)  # ok: FC103
        return report

    # -- per step ------------------------------------------------------------------------------------------------

    def _prepare_inputs(self, sched: SchedulerOutput) -> tuple[int, int]:
        num_reqs = len(sched.req_rows)
        tokens = np.asarray(sched.num_scheduled_tokens, dtype=np.int32)
        computed = np.asarray(sched.num_computed_tokens, dtype=np.int32)
        total = int(tokens.sum())

        self.query_start_loc_np[0] = 0
        np.cumsum(tokens, out=self.query_start_loc_np[1 : num_reqs + 1])
        self.seq_lens_np[:num_reqs] = computed + tokens
        req_indices = np.repeat(np.arange(num_reqs), tokens)
        offsets = np.arange(total) - np.repeat(self.query_start_loc_np[:num_reqs], tokens)
        positions = computed[req_indices] + offsets
        self.positions_np[:total] = positions
        self.input_ids_np[:total] = np.concatenate([np.asarray(t, dtype=np.int32) for t in sched.token_ids])

        max_blocks = int(self.seq_lens_np[:num_reqs].max()) // self.cfg.page_size + 1
        self.block_table.ensure_capacity(num_reqs, max_blocks)
        for row, block_ids in sched.new_block_ids.items():
            self.block_table.append_row(row, block_ids)
        self.block_table.compute_slot_mapping(req_indices, positions)
        self.block_table.commit(num_reqs, total)

        self.input_ids[:total].copy_(self.input_ids_cpu[:total], non_blocking=True)
        self.positions[:total].copy_(self.positions_cpu[:total], non_blocking=True)
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        return num_reqs, total

    def _common_metadata(self, num_reqs: int, num_tokens: int) -> CommonAttentionMetadata:
        query_lens = np.diff(self.query_start_loc_np[: num_reqs + 1])
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=int(query_lens.max()) if num_reqs else 0,
            block_table_tensor=self.block_table.block_table[:num_reqs],
            slot_mapping=self.block_table.slot_mapping[:num_tokens],
        )

    def _dummy_common_metadata(self, bs: int) -> CommonAttentionMetadata:
        """``bs`` one-token requests on page 0, for capture."""
        self.query_start_loc_np[: bs + 1] = np.arange(bs + 1)
        self.seq_lens_np[:bs] = 1
        self.positions_np[:bs] = 0
        self.input_ids_np[:bs] = 0
        self.block_table.slot_mapping_np[:bs] = 0
        self.block_table.commit(bs, bs)
        self.query_start_loc[: bs + 1].copy_(self.query_start_loc_cpu[: bs + 1], non_blocking=True)
        self.seq_lens[:bs].copy_(self.seq_lens_cpu[:bs], non_blocking=True)
        self.positions[:bs].copy_(self.positions_cpu[:bs], non_blocking=True)
        self.input_ids[:bs].copy_(self.input_ids_cpu[:bs], non_blocking=True)
        return self._common_metadata(bs, bs)

    def _sampling_metadata(self, num_reqs: int) -> SamplingMetadata:
        temperature_np = self.temperature_np[:num_reqs]
        self.temperature[:num_reqs].copy_(self.temperature_cpu[:num_reqs], non_blocking=True)
        self.min_tokens[:num_reqs].copy_(self.min_tokens_cpu[:num_reqs], non_blocking=True)
        self.output_lens[:num_reqs].copy_(self.output_lens_cpu[:num_reqs], non_blocking=True)
        self.num_logprobs[:num_reqs].copy_(self.num_logprobs_cpu[:num_reqs], non_blocking=True)
        return SamplingMetadata(
            temperature=self.temperature[:num_reqs],
            all_greedy=bool((temperature_np < _SAMPLING_EPS).all()),
            min_tokens=self.min_tokens[:num_reqs],
            output_lens=self.output_lens[:num_reqs],
            num_logprobs=self.num_logprobs[:num_reqs],
            max_num_logprobs=int(self.num_logprobs_np[:num_reqs].max()) if num_reqs else 0,
        )

    def _upload_block_moves(self, moves: list[tuple[int, int]]) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        moves_np = np.asarray(moves, dtype=np.int32).reshape(-1, 2)
        n = moves_np.shape[0]
        self._moves_cpu[:, :n] = torch.from_numpy(moves_np.T.copy())
        self._moves[:, :n].copy_(self._moves_cpu[:, :n], non_blocking=True)
        return moves_np, self._moves[0, :n], self._moves[1, :n]

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> SamplerOutput:
        num_reqs, num_tokens = self._prepare_inputs(sched)
        common = self._common_metadata(num_reqs, num_tokens)
        attn_metadata = self.attn_metadata_builder.build(sched.common_prefix_len, common)

        if sched.block_moves:
            moves_np, src, dst = self._upload_block_moves(sched.block_moves)
            self.compactor.apply(moves_np, src, dst, num_reqs)

        bs = attn_metadata.padded_bs
        if bs is not None and bs > num_reqs:
            # padded rows of a replayed batch must look like one-token requests to the decode kernel
            self.attn_metadata_builder.paged_kv_last_page_len[num_reqs:bs].fill_(1)  # expect: FC104

        hidden = self.model(self.input_ids[:num_tokens], self.positions[:num_tokens], attn_metadata)
        logits_indices = (self.query_start_loc[1 : num_reqs + 1] - 1).long()
        logits = self._raw_model.compute_logits(hidden[logits_indices])
        out = self.sampler(logits, self._sampling_metadata(num_reqs))

        # hand the sampled ids to the output thread; it waits on the event before reading them
        self.sampled_cpu[:num_reqs].copy_(out.sampled_token_ids, non_blocking=True)
        self._sampled_ready.record()
        return out

    def take_sampled_token_ids(self, num_reqs: int) -> list[int]:
        """Called by the output thread, not by the step."""
        self._sampled_ready.synchronize()
        return self.sampled_cpu[:num_reqs].tolist()


def build_runner(cfg: EngineConfig, device: Any = "cuda") -> GPUModelRunner:
    runner = GPUModelRunner(cfg, torch.device(device))
    runner.initialize_kv_cache()
    runner.profile_run()
    runner.capture_model()
    return runner
