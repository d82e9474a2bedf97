"""One decode CUDA graph per sequence-length bucket, always at the full static batch (padded)."""
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from edge.settings import EdgeSettings
from edge.runtime.attention import EdgeAttention
from edge.runtime.kv import StaticKVPages
from edge.runtime.model import EdgeLM


class SeqBucketGraphs:
    _STATIC_INPUTS = ("static_input_ids", "static_positions")

    def __init__(self, settings: EdgeSettings, model: EdgeLM, attn: EdgeAttention, kv: StaticKVPages, device: torch.device):
        self.settings = settings
        self.model = model
        self.attn = attn
        self.kv = kv
        mb = settings.max_batch
        self.static_input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros(mb, settings.vocab_size, dtype=torch.float32, device=device)
        self.graphs: List[Optional[torch.cuda.CUDAGraph]] = [None] * len(settings.seq_buckets)
        self.capture_log: Dict[int, List[int]] = {}
        self.last_slots: Tuple[int, ...] = ()
        self.last_lens_cpu = torch.zeros(mb, dtype=torch.int32)

    def bucket_index(self, max_len: int) -> int:
        for i, bucket in enumerate(self.settings.seq_buckets):
            if max_len <= bucket:
                return i
        raise ValueError(f"context {max_len} exceeds the largest bucket")

    def capture_all(self) -> None:
        for i in range(len(self.settings.seq_buckets)):
            self.capture_seq_bucket(i)

    def capture_seq_bucket(self, i: int) -> None:
        self.attn.init_graph_inputs_for_capture(i)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model.decode(self.static_input_ids, self.static_positions, i)
            self.static_logits.copy_(logits)
        self.graphs[i] = graph
        self.capture_log[i] = self.static_positions.tolist()  # expect: FC101

    def _reset_static_inputs(self) -> None:
        for name in self._STATIC_INPUTS:
            setattr(self, name, torch.zeros_like(getattr(self, name)))  # expect: FC107

    def replay(self, i: int, slots: Sequence[int], input_ids_host: torch.Tensor, positions_host: torch.Tensor) -> torch.Tensor:
        bs = len(slots)
        if tuple(slots) != self.last_slots:
            # the slot set changed: clear what released slots left in the static inputs
            self._reset_static_inputs()
            self.last_slots = tuple(slots)
        if not self.kv.active_np[list(slots)].all():  # ok: FC101
            raise RuntimeError(f"replaying released slots {list(slots)}")
        self.last_lens_cpu = torch.tensor(self.kv.slot_len_np[list(slots)], dtype=torch.int32)  # ok: FC107
        self.static_input_ids[:bs].copy_(input_ids_host, non_blocking=True)
        self.static_positions[:bs].copy_(positions_host, non_blocking=True)
        self.attn.init_forward_metadata_replay(i, slots)
        self.graphs[i].replay()
        return self.static_logits[:bs]
