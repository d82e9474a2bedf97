from typing import Callable, Dict

import torch

from cgt import DecodeBatch, ServingConfig, mark_dynamic_dims
from cg_attn.backend import GraphTreeAttnBackend
from cg_attn.metadata import DecodeMetadata, DecodeMetadataBuilder
from cg_run.model import DecoderModel, ForwardCtx


class CompiledStepRunner:
    """Large buckets: torch.compile(mode="reduce-overhead") records graph trees; plans run outside."""

    def __init__(self, model: DecoderModel, backend: GraphTreeAttnBackend, cfg: ServingConfig):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.static_input_ids = self._per_bucket(cfg.compiled_buckets)
        self.static_positions = self._per_bucket(cfg.compiled_buckets)
        self.static_slots = self._per_bucket(cfg.compiled_buckets)
        self._step_fn = torch.compile(model.forward_decode, mode="reduce-overhead", fullgraph=False)
        self._last_sig: Dict[int, object] = {}
        self.replans = 0

    def _per_bucket(self, buckets) -> Dict[int, torch.Tensor]:
        return {bs: torch.zeros(bs, dtype=torch.long, device=self.device) for bs in buckets}

    def warmup(self, builder: DecodeMetadataBuilder, make_dummy: Callable[[int], DecodeBatch]) -> None:
        # the page pools grow; the batch dimension stays static per bucket
        mark_dynamic_dims(self.model.kv_caches, dim=0)
        for bs in self.cfg.compiled_buckets:
            batch = make_dummy(bs)
            meta = builder.build(batch, bs)
            self.backend.init_forward_metadata(meta)
            for _ in range(3):  # record, then warm the tree
                self.run(batch, meta)
        torch.cuda.synchronize()

    def run(self, batch: DecodeBatch, meta: DecodeMetadata) -> torch.Tensor:
        bs, n = meta.bucket, meta.num_reqs
        self.static_input_ids[bs][:n].copy_(batch.input_ids)  # ok: FC104
        self.static_positions[bs][:n].copy_(batch.positions)
        self.static_slots[bs][:n].copy_(batch.slot_mapping)
        bufs = self.backend.compiled_bufs[bs]
        # the trees read the indices by address; refresh them from this step's table
        bufs["indices"][: meta.num_indices].copy_(meta.kv_indices)  # expect: FC104
        sig = vars(self.backend.graph_wrappers[bs]).get("_plan_info")  # expect: FC103
        self.replans += int(sig is not self._last_sig.get(bs))
        self._last_sig[bs] = sig
        ctx = ForwardCtx(bs, n, self.static_slots[bs], meta.block_tables, meta.seq_lens, meta.max_seq_len)
        logits = self._step_fn(self.static_input_ids[bs], self.static_positions[bs], ctx)
        return logits[:n].clone()
