import numpy as np
import ray
import torch

from raypp import MicroBatch, PipelineConfig, ShmChannel, StageSpec, count_tokens
from rp_stage.attention import StageAttention, StageMetaBuilder
from rp_stage.graphs import StageGraphs
from rp_stage.model import StageModel


def dummy_microbatch(bs: int, cfg: PipelineConfig) -> MicroBatch:
    return MicroBatch(
        mb_id=-1, bucket=bs, num_reqs=bs, req_ids=list(range(bs)),
        input_ids_cpu=torch.zeros(bs, dtype=torch.long), positions_cpu=torch.zeros(bs, dtype=torch.long),
        seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
        page_table_np=np.zeros((bs, cfg.max_seq_len // cfg.page_size), dtype=np.int32))


@ray.remote(num_gpus=1)
class StageActor:
    """Owns one slice of layers with its own wrappers, workspaces and graphs;
    activations come in and go out through shared-memory channels."""

    def __init__(self, cfg: PipelineConfig, spec: StageSpec, in_name: str, out_name: str):
        self.cfg = cfg
        self.spec = spec
        self.device = torch.device(cfg.device)
        self.buckets = sorted(cfg.microbatch_buckets)
        self.attn = StageAttention(cfg, spec.first_layer)
        self.model = StageModel(cfg, spec, self.attn).to(self.device, cfg.dtype)
        self.builder = StageMetaBuilder(cfg)
        self.graphs = StageGraphs(self.model, self.attn, cfg, spec)
        self.in_channel = None if spec.is_first else ShmChannel(in_name, cfg.channel_bytes(), cfg.dtype)
        out_dtype = torch.long if spec.is_last else cfg.dtype
        self.out_channel = ShmChannel(out_name, cfg.channel_bytes(), out_dtype, create=True)
        self.kv_tokens = 0

    def record_graphs(self) -> bool:
        self.attn.init_stage_buffers()
        for bi in reversed(range(len(self.buckets))):
            bs = self.buckets[bi]
            self.graphs.record(bi, bs, self.builder.build(dummy_microbatch(bs, self.cfg)))
        return True

    def execute_microbatch(self, mb: MicroBatch) -> int:
        meta = self.builder.build(mb)
        self.kv_tokens += count_tokens(meta.seq_lens)
        n = mb.num_reqs
        if mb.bucket is None:
            self.attn.set_eager(meta)
            if self.spec.is_first:
                x = mb.input_ids_cpu.to(self.device, non_blocking=True)
            else:
                x = torch.empty(n, self.cfg.hidden_size, dtype=self.cfg.dtype, device=self.device)
                self.in_channel.recv_into(x)
            out = self.model(x, meta.slots, None)
        else:
            bi = self.buckets.index(mb.bucket)
            self.attn.plan_microbatch(bi, meta)
            dst = self.graphs.input_view(mb.bucket, n)
            if self.spec.is_first:
                dst.copy_(mb.input_ids_cpu, non_blocking=True)
            else:
                self.in_channel.recv_into(dst)
            self.graphs.load_slots(mb.bucket, meta.slots)
            out = self.graphs.replay(mb.bucket)[:n]
            # this round appended one token per row
            self.attn.kv_last_page[bi][:n].add_(1)  # expect: FC104
        self.out_channel.send(out.argmax(-1) if self.spec.is_last else out)
        return mb.mb_id

    def stats(self) -> dict:
        return {"stage": self.spec.stage_id, "kv_tokens": self.kv_tokens}
