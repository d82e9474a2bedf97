"""The GPU worker process: a pipe-driven command loop around one GpuWorker."""

from __future__ import annotations

import logging
import multiprocessing as mp
from multiprocessing.connection import Connection
from typing import Dict

import torch

from .backends.base import AttentionBackend
from .batch import StepInputs, StepMessage
from .config import EngineConfig
from .graph_runner import GraphRunner
from .plugins import create_backend
from .shm import HostMirror, MirrorLayout

logger = logging.getLogger(__name__)


class GpuWorker:
    def __init__(self, cfg: EngineConfig, rank: int, shm_name: str) -> None:
        assert 0 <= rank < cfg.world_size, "worker rank outside the world"  # expect: FC109
        self.cfg = cfg
        self.rank = rank
        self.device = torch.device("cuda", rank)
        self.mirror = HostMirror.attach(shm_name, MirrorLayout.from_config(cfg))
        self.backend: AttentionBackend = create_backend(cfg, self.device)
        hidden = cfg.num_qo_heads * cfg.head_dim
        # stand-in model: embedding -> q projection -> attention -> lm head
        self.embed = torch.nn.Embedding(cfg.vocab_size, hidden).to(self.device, torch.bfloat16)
        self.q_proj = torch.nn.Linear(hidden, hidden, bias=False).to(self.device, torch.bfloat16)
        self.lm_head = torch.nn.Linear(hidden, cfg.vocab_size, bias=False).to(self.device, torch.bfloat16)
        self.kv_cache = torch.zeros(
            cfg.max_num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.graph_runner = GraphRunner(self.backend, cfg, self.kv_cache, self.device)

    def _build_inputs(self, msg: StepMessage) -> StepInputs:
        m = self.mirror
        bs, n = msg.batch_size, msg.num_tokens
        dev = self.device
        kv_indptr_host = torch.from_numpy(m.kv_indptr_np[: bs + 1])
        nnz = int(kv_indptr_host[bs])
        qo_indptr_host = torch.from_numpy(m.qo_indptr_np[: bs + 1])
        last_host = torch.from_numpy(m.kv_last_page_len_np[:bs])
        seq_lens_host = torch.from_numpy(m.seq_lens_np[:bs])
        return StepInputs(
            batch_size=bs,
            num_tokens=n,
            is_decode=msg.is_decode,
            token_ids=torch.from_numpy(m.token_ids_np[:n]).to(dev, non_blocking=True),
            positions=torch.from_numpy(m.positions_np[:n]).to(dev, non_blocking=True),
            qo_indptr=qo_indptr_host.to(dev, non_blocking=True),
            qo_indptr_host=qo_indptr_host,
            kv_indptr_host=kv_indptr_host,
            kv_indices=torch.from_numpy(m.kv_indices_np[:nnz]).to(dev, non_blocking=True),
            kv_last_page_len=last_host.to(dev, non_blocking=True),
            kv_last_page_len_host=last_host,
            seq_lens=seq_lens_host.to(dev, non_blocking=True),
            seq_lens_host=seq_lens_host,
        )

    def execute_model(self, msg: StepMessage) -> torch.Tensor:
        cfg = self.cfg
        inputs = self._build_inputs(msg)
        bs = inputs.batch_size
        hidden = self.embed(inputs.token_ids.long())
        q = self.q_proj(hidden).view(-1, cfg.num_qo_heads, cfg.head_dim)
        if inputs.is_decode and self.graph_runner.has_bucket(bs):
            out = self.graph_runner.replay(bs, inputs, q)
        else:
            self.backend.init_forward_metadata(inputs)
            if inputs.is_decode:
                out = self.backend.forward_decode(q, self.kv_cache, bs)
            else:
                out = self.backend.forward_extend(q, self.kv_cache)
        last = out if inputs.is_decode else out[inputs.qo_indptr[1:].long() - 1]
        logits = self.lm_head(last.flatten(1))
        next_tokens = torch.argmax(logits, dim=-1)
        if self.rank == 0:
            # advance the lengths in the shared mirror for the driver's next schedule
            self.mirror.seq_lens_np[:bs] = (inputs.seq_lens + 1).cpu().numpy()  # expect: FC101
        return next_tokens

    def send_results(self, conn: Connection, next_tokens: torch.Tensor) -> None:
        conn.send(("tokens", next_tokens.tolist()))  # ok: FC101

    def capture_graphs(self) -> None:
        if not self.backend.supports_cuda_graph:
            logger.info("backend %s does not support CUDA graphs", self.backend.describe())
            return
        self.graph_runner.record_all()

    def resync_from_mirror(self, bs: int) -> None:
        """After the driver preempts and re-packs, reload the last-page lengths it rewrote."""
        last = torch.from_numpy(self.mirror.kv_last_page_len_np[:bs])
        self.backend.kv_last_page_len[:bs].copy_(last, non_blocking=True)  # expect: FC104

    def report_memory(self) -> Dict[str, int]:
        graph_wrappers = getattr(self.backend, "graph_wrappers", {})
        graph_ws = sum(w._float_workspace_buffer.numel() for w in graph_wrappers.values())  # expect: FC103
        return {
            "allocated": torch.cuda.memory_allocated(self.device),
            "reserved": torch.cuda.memory_reserved(self.device),
            "graph_workspace": graph_ws,
        }

    def close(self) -> None:
        self.graph_runner.graphs.clear()
        self.mirror.close()


def run_worker(rank: int, cfg: EngineConfig, conn: Connection, shm_name: str, events: "mp.Queue") -> None:
    """Target of the spawned process: build the worker, then serve commands."""
    torch.cuda.set_device(rank)
    worker = GpuWorker(cfg, rank, shm_name)
    events.put(("ready", rank, worker.backend.describe()))
    while True:
        cmd, payload = conn.recv()
        if cmd == "step":
            tokens = worker.execute_model(payload)
            worker.send_results(conn, tokens)
        elif cmd == "capture":
            worker.capture_graphs()
            conn.send(("captured", sorted(worker.graph_runner.graphs)))
        elif cmd == "resync":
            worker.resync_from_mirror(payload)
            conn.send(("resynced", payload))
        elif cmd == "stats":
            conn.send(("stats", worker.report_memory()))
        elif cmd == "shutdown":
            worker.close()
            conn.send(("bye", rank))
            break
        else:
            conn.send(("error", f"unknown command {cmd!r}"))
