import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from tensorrt_llm._torch.attention_backend.flashinfer import FlashInferAttention, FlashInferAttentionMetadata

from .cuda_graph_runner import CUDAGraphRunner


class MTPDraftAttention:
    def __init__(self, workspace, num_heads, head_dim):
        self.draft_decode = BatchDecodeWithPagedKVCacheWrapper(workspace, "HND")
        self.num_heads = num_heads
        self.head_dim = head_dim

    def forward_draft(self, q, kv_cache):
        return self.draft_decode.run(q, kv_cache)  # expect: FC108


class PyTorchModelEngine:
    def __init__(self, model, max_num_requests, max_num_tokens, cuda_graph_batch_sizes):
        self.model = model
        self.attn_metadata = FlashInferAttentionMetadata(max_num_requests=max_num_requests, max_num_tokens=max_num_tokens, is_cuda_graph=True)
        self.attn = FlashInferAttention(0, model.num_heads, model.head_dim, model.num_kv_heads)
        self.mtp = MTPDraftAttention(self.attn_metadata.workspace_buffer, model.num_heads, model.head_dim)
        self.static_inputs = {}
        self.cuda_graph_runner = CUDAGraphRunner(self, cuda_graph_batch_sizes)

    def forward_step(self, inputs):
        q, kv_cache = self.model.qkv(inputs["input_ids"])
        out = self.attn.forward(q, kv_cache, self.attn_metadata)
        draft = self.mtp.forward_draft(out, kv_cache)
        return self.model.head(out, draft)

    def forward(self, scheduled_requests, inputs):
        seq_lens = [len(r.new_tokens) for r in scheduled_requests]
        kv_lens = [r.past_len + len(r.new_tokens) for r in scheduled_requests]
        num_ctx = sum(1 for r in scheduled_requests if r.is_context)  # ok: FC101
        self.attn_metadata.set_batch(seq_lens, kv_lens, num_ctx)
        self.attn_metadata.prepare()
        bs = self.cuda_graph_runner.padded_batch_size(len(seq_lens))
        if num_ctx == 0 and bs is not None:
            return self.cuda_graph_runner.replay(bs, inputs)
        return self.forward_step(inputs)
