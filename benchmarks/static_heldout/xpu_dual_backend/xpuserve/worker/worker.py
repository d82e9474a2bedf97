"""The worker: picks the platform backend from the registry at start-up and runs one step per call."""
import numpy as np
import torch
from torch import nn

from xpuserve.platforms import detect_platform, get_backend_cls
from xpuserve.platforms.base import StepInput
from xpuserve.worker.graph_runner import GraphRunner


class Worker:
    def __init__(self, cfg):
        self.cfg = cfg
        self.platform = detect_platform()
        self.device = torch.device("npu" if self.platform == "ascend" else "cuda", cfg.local_rank)
        self.backend = get_backend_cls(self.platform)(cfg, self.device)
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden).to(self.device)
        self.lm_head = torch.zeros((cfg.vocab_size, hidden), dtype=torch.bfloat16, device=self.device)
        self.logits_buf = torch.empty((cfg.max_num_seqs, cfg.vocab_size), dtype=torch.bfloat16, device=self.device)
        self.sampled_pinned = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.graph_runner = GraphRunner(self.backend, cfg) if self.platform == "cuda" and cfg.cuda_graph_sizes else None
        self.copy_done = torch.cuda.Event() if self.platform == "cuda" else None

    def make_step_input(self, query_lens: list[int], seq_lens: list[int], block_table_np: np.ndarray, slots: list[int]):
        q_np = np.asarray(query_lens, dtype=np.int32)
        s_np = np.asarray(seq_lens, dtype=np.int32)
        if self.platform == "cuda":
            flat = np.concatenate([block_table_np[i, : -(-s // self.cfg.page_size)] for i, s in enumerate(seq_lens)])
            with torch.cuda.stream(self.backend.copy_stream):
                self.backend.block_ids_staging[: flat.size].copy_(torch.from_numpy(flat), non_blocking=True)
        return StepInput(
            num_reqs=len(query_lens),
            query_lens=torch.from_numpy(q_np).to(self.device, non_blocking=True),
            query_lens_cpu=q_np,
            query_lens_list=list(query_lens),
            seq_lens=torch.from_numpy(s_np).to(self.device, non_blocking=True),
            seq_lens_cpu=s_np,
            block_table_cpu=block_table_np,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(self.device, non_blocking=True),
            is_uniform_decode=all(q == 1 for q in query_lens),
        )

    def execute_model(self, batch: StepInput, input_ids: torch.Tensor):
        num_tokens = int(batch.query_lens_cpu.sum())  # ok: FC101
        n = batch.num_reqs
        h = self.embed(input_ids[:num_tokens]).view(num_tokens, self.cfg.num_qo_heads, self.cfg.head_dim)
        if self.graph_runner is not None and batch.is_uniform_decode and n <= self.graph_runner.bs_list[-1]:
            out = self.graph_runner.replay(batch, h)
        else:
            self.backend.begin_step(batch)
            out = h
            for layer_id in range(self.cfg.num_layers):
                out = out + self.backend.forward_eager(out, layer_id)
        last = torch.from_numpy(np.cumsum(batch.query_lens_cpu) - 1).to(self.device, non_blocking=True)
        logits = self.logits_buf[:n]
        torch.matmul(out.flatten(1)[last], self.lm_head.t(), out=logits)
        if torch.isnan(logits).any():  # expect: FC101
            raise FloatingPointError("NaN in logits; check the attention backend's inputs")
        self.sampled_pinned[:n].copy_(logits.argmax(-1), non_blocking=True)  # ok: FC101
        if self.copy_done is not None:
            self.copy_done.record()
        return self.sampled_pinned[:n], self.copy_done
