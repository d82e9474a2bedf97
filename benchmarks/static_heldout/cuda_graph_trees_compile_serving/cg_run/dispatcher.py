import torch

from cgt import BucketPolicy, DecodeBatch, PaddedView
from cgt.compat import GRAPH_FLAG_ATTR
from cg_attn.backend import GraphTreeAttnBackend
from cg_attn.metadata import DecodeMetadataBuilder
from cg_run.compiled import CompiledStepRunner
from cg_run.hand_graphs import HandGraphRunner
from cg_run.model import DecoderModel, ForwardCtx


class StepDispatcher:
    """Per batch: a hand-captured graph, a compiled graph tree or the eager overflow path."""

    def __init__(self, policy: BucketPolicy, builder: DecodeMetadataBuilder, backend: GraphTreeAttnBackend,
                 hand: HandGraphRunner, compiled: CompiledStepRunner, model: DecoderModel):
        self.policy = policy
        self.builder = builder
        self.backend = backend
        self.hand = hand
        self.compiled = compiled
        self.model = model
        self.max_bucket = policy.max_bucket

    def _graph_ready(self, bucket: int) -> bool:
        w = self.backend.graph_wrappers.get(bucket)
        return w is not None and bool(getattr(w, GRAPH_FLAG_ATTR, False))  # expect: FC103

    def dispatch(self, batch: DecodeBatch, allow_overflow: bool = True) -> torch.Tensor:
        assert allow_overflow or batch.size <= self.max_bucket, "batch exceeds the largest graph bucket"  # expect: FC109
        bucket = self.policy.bucket_for(batch.size)
        if bucket is None or not self._graph_ready(bucket):
            return self._eager(batch)
        meta = self.builder.build(batch, bucket)
        if self.policy.is_compiled(bucket):
            self.backend.init_forward_metadata(meta)
            return self.compiled.run(batch, meta)
        self.backend.init_forward_metadata_replay_cuda_graph(bucket, meta)
        return self.hand.replay(PaddedView(batch, bucket))

    def _eager(self, batch: DecodeBatch) -> torch.Tensor:
        n = batch.size
        meta = self.builder.build(batch, n)
        ctx = ForwardCtx(None, n, batch.slot_mapping, meta.block_tables, meta.seq_lens, meta.max_seq_len)
        return self.model.forward_decode(batch.input_ids, batch.positions, ctx)
