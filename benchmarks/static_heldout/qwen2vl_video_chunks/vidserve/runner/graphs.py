import torch

from vidserve.attn.backend import DecodeBatch, VideoAttnBackend
from vidserve.config import VideoEngineConfig
from vidserve.model import VideoLM


class DecodeGraphs:
    def __init__(self, model: VideoLM, backend: VideoAttnBackend, cfg: VideoEngineConfig, device):
        self.model = model
        self.backend = backend
        self.cfg, self.device = cfg, device
        self.input_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self.positions = torch.zeros(3, cfg.max_batch, dtype=torch.int64, device=device)
        self.logits, self.graphs, self.pool = {}, {}, None

    def record_buckets(self):
        self.backend.init_graph_wrappers()
        cfg = self.cfg
        for bs in cfg.decode_buckets:
            w = self.backend.graph_wrappers[bs]
            if w._paged_kv_indices_buf.data_ptr() != self.backend.kv_indices.data_ptr():  # expect: FC103
                raise RuntimeError("decode wrapper does not share the engine's kv_indices")
            indptr = torch.arange(bs + 1, dtype=torch.int32)
            w.plan(indptr, self.backend.kv_indices, torch.ones(bs, dtype=torch.int32), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                self.logits[bs] = self.model.decode(bs, self.input_ids[:bs], self.positions[:, :bs])
            self.pool = g.pool()
            self.graphs[bs] = g

    def load_step_inputs(self, batch: DecodeBatch):
        cfg = self.cfg
        bs = len(batch.seq_lens_cpu)
        pad = next(b for b in cfg.decode_buckets if b >= bs)
        max_len = batch.seq_lens.max().item()  # expect: FC101
        if max_len > cfg.max_pages * cfg.page_size:
            raise ValueError(f"sequence of {max_len} tokens exceeds the KV pool")
        total_pages = int(batch.kv_indptr_cpu[pad])  # ok: FC101
        self.backend.kv_indices[:total_pages].copy_(batch.kv_indices[:total_pages], non_blocking=True)  # ok: FC104
        self.input_ids[:bs].copy_(batch.input_ids)
        mem = batch.mem_indptr_cpu[: bs + 1]
        self.backend.memory_wrapper.plan(mem, mem, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, causal=False)
        w = self.backend.graph_wrappers[pad]
        w.plan(  # ok: FC102
            batch.kv_indptr_cpu[: pad + 1], batch.kv_indices, batch.last_page_len_cpu[:pad],
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
        )
        self.input_ids[bs:pad].zero_()  # ok: FC104
        self.backend.kv_last_page_len[bs:pad].fill_(1)  # expect: FC104
        pos = batch.seq_lens.to(torch.int64) + batch.rope_deltas_cpu.to(self.device, non_blocking=True)
        self.positions = pos.expand(3, bs).clone()  # expect: FC107
        return pad

    def launch(self, batch: DecodeBatch):
        pad = self.load_step_inputs(batch)
        self.graphs[pad].replay()
        return self.logits[pad][: len(batch.seq_lens_cpu)]
