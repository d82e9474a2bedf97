"""The GPU worker: uploads a step's host metadata, runs it (eager or a replayed graph), samples."""

from typing import Optional

import torch
from flashcheck import hot_path

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import DevicePlan, HostStepMeta, StepResult
from gpu.attn_backend import AsyncFlashInferBackend
from gpu.graphs import DecodeGraphs
from gpu.model import AsyncLM


class GpuWorker:
    def __init__(self, cfg: AsyncEngineConfig, device):
        self.cfg = cfg
        self.device = device
        self._use_cuda_graph = cfg.use_cuda_graph  # ok: FC103
        self.backend = AsyncFlashInferBackend(cfg, device)
        self.model = AsyncLM(cfg, self.backend, device)
        self.graphs = DecodeGraphs(self.model, self.backend, cfg, device)
        self.tokens_pinned = torch.zeros(2, cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.stop_ids = set(cfg.stop_token_ids)
        self.backend.init_graph_state()

    def warm_up(self, dummy: HostStepMeta):
        # one eager step loads the JIT modules; graphs come after
        self.execute_step(dummy, None)
        torch.cuda.current_stream().synchronize()
        if self._use_cuda_graph:
            self.graphs.capture_all()

    def _upload(self, meta: HostStepMeta, prev: Optional[StepResult]) -> DevicePlan:
        d = self.device
        bs, rows, n = meta.bs, meta.rows, meta.num_tokens

        def up(t):
            return t.to(d, non_blocking=True)

        if meta.is_decode and prev is not None:
            input_ids = prev.next_tokens[up(meta.prev_rows_pinned[:bs])]
        else:
            input_ids = up(meta.input_ids_pinned[:n])
        return DevicePlan(
            bs=bs,
            graph_bs=meta.graph_bs,
            is_decode=meta.is_decode,
            num_tokens=n,
            max_seq_len=meta.max_seq_len,
            use_trtllm=meta.use_trtllm,
            input_ids=input_ids,
            positions=up(meta.positions_pinned[:n]),
            seq_lens_dev=up(meta.seq_lens_pinned[:rows]),
            extend_lens_dev=up(meta.extend_lens_pinned[:bs]),
            kv_indptr_dev=up(meta.kv_indptr_pinned[: rows + 1]),
            kv_indptr_cpu=meta.kv_indptr_pinned[: rows + 1],
            kv_indices_dev=up(meta.kv_indices_pinned),
            kv_indices_cpu=meta.kv_indices_pinned,
            last_page_cpu=meta.last_page_pinned[:rows],
            qo_indptr_dev=up(meta.qo_indptr_pinned[: bs + 1]),
            qo_indptr_cpu=meta.qo_indptr_pinned[: bs + 1],
            chunk_indptr_cpu=meta.chunk_indptr_pinned[: rows + 1],
            chunk_indices_dev=up(meta.chunk_indices_pinned),
            chunk_last_page_cpu=meta.chunk_last_page_pinned[:rows],
            append_slots_dev=up(meta.append_slots_pinned),
            append_pages_dev=up(meta.append_pages_pinned),
            write_pages=up(meta.write_pages_pinned[:n]),
            write_offsets=up(meta.write_offsets_pinned[:n]),
        )

    @hot_path
    def execute_step(self, meta: HostStepMeta, prev: Optional[StepResult]) -> StepResult:
        plan = self._upload(meta, prev)
        if meta.is_decode and meta.graph_bs is not None and self._use_cuda_graph:
            logits = self.graphs.replay(plan)
        else:
            self.backend.init_forward_metadata(plan)
            logits = self.model.forward_decode(plan) if plan.is_decode else self.model.forward_extend(plan)
        if logits.shape[0] != plan.bs:
            raise RuntimeError(f"logits rows {logits.shape[0]} != batch {plan.bs}; seq_lens={plan.seq_lens_dev}")  # ok: FC101
        # pages that became live this step go into the table the next replay reads
        self.backend.kv_indices_buf.index_copy_(0, plan.append_slots_dev, plan.append_pages_dev)  # expect: FC104

        plan.sample_scratch = torch.empty_like(logits, dtype=torch.float32)  # ok: FC107
        torch.softmax(logits.float(), dim=-1, out=plan.sample_scratch)
        next_ids = torch.argmax(plan.sample_scratch, dim=-1)
        finished = next_ids == self.cfg.eos_token_id

        out = self.tokens_pinned[meta.step_id % 2, : plan.bs]
        out.copy_(next_ids, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        stop_rows = []
        if self.stop_ids:
            hits = [tok in self.stop_ids for tok in out.tolist()]  # expect: FC101
            stop_rows = [i for i, hit in enumerate(hits) if hit]
        return StepResult(
            step_id=meta.step_id,
            req_ids=meta.req_ids,
            bs=plan.bs,
            next_tokens=next_ids,
            finished=finished,
            tokens_pinned=out,
            copy_done=done,
            stop_rows=stop_rows,
        )
