import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from vllm.v1.attention.backends.mla.common import CommonAttentionMetadata, MLADecodeMetadata, MLAMetadata

_ws_cache = {}


def get_mla_decode_workspace(device, num_sms):
    if device not in _ws_cache:
        _ws_cache[device] = torch.empty(num_sms * 4 * 1024 * 1024, dtype=torch.uint8, device=device)  # expect: FC105
    return _ws_cache[device]


class FlashInferMLAMetadataBuilder:
    def __init__(self, kv_cache_spec, vllm_config, device):
        self.device = device
        self.block_size = kv_cache_spec.block_size
        self.num_spec_tokens = vllm_config.num_speculative_tokens
        max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.decode_seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.pad = torch.zeros(8, dtype=torch.int32, device=device)
        self.pad_cpu = torch.zeros(8, dtype=torch.int32)
        self.prefill_workspace = torch.empty(vllm_config.scheduler_config.max_num_batched_tokens * 1024, dtype=torch.uint8, device=device)  # ok: FC105, FC106
        self._prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD")

    def _split(self, query_start_loc_cpu, num_reqs):
        query_lens = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
        num_decodes = int((query_lens <= 1 + self.num_spec_tokens).sum())  # ok: FC101
        return num_decodes, num_reqs - num_decodes

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False) -> MLAMetadata:
        seq_lens = common_attn_metadata.seq_lens
        seq_lens_cpu = common_attn_metadata.seq_lens_cpu
        num_decodes, num_prefills = self._split(common_attn_metadata.query_start_loc_cpu, common_attn_metadata.num_reqs)
        num_decode_tokens = int(common_attn_metadata.query_start_loc_cpu[num_decodes])  # ok: FC101
        assert num_decode_tokens == num_decodes * (1 + self.num_spec_tokens)  # expect: FC109
        max_blocks = seq_lens.max() // self.block_size + 1
        block_table = common_attn_metadata.block_table_tensor[:num_decodes, :max_blocks]  # expect: FC101
        max_blocks_host = int(seq_lens_cpu.max()) // self.block_size + 1  # ok: FC101
        blocks_per_req = [int(n) for n in (seq_lens + self.block_size - 1) // self.block_size]  # expect: FC101
        self.decode_seq_lens[:num_decodes].copy_(seq_lens[:num_decodes])
        self.seq_lens_padded = torch.cat([seq_lens, self.pad])  # expect: FC107
        self.seq_lens_host = torch.cat([seq_lens_cpu, self.pad_cpu])  # ok: FC107
        if hasattr(self._prefill_wrapper, "_cached_module"):  # expect: FC103
            self._prefill_wrapper.reset_workspace_buffer(self.prefill_workspace, self.prefill_workspace)
        decode = MLADecodeMetadata(block_table=block_table, seq_lens=self.decode_seq_lens[:num_decodes], max_seq_len=max_blocks_host * self.block_size)
        prefill_qsl = None
        if num_prefills:
            prefill_qsl = common_attn_metadata.query_start_loc[num_decodes:] - num_decode_tokens
            prefill_qsl_cpu = common_attn_metadata.query_start_loc_cpu[num_decodes:] - num_decode_tokens
            self._prefill_wrapper.plan(prefill_qsl_cpu, prefill_qsl_cpu, 128, 128, 192, causal=True, head_dim_vo=128)  # ok: FC102
        return MLAMetadata(num_decodes, num_prefills, decode, prefill_qsl), blocks_per_req


class FlashInferMLAImpl:
    WORKSPACE_BYTES = 128 * 1024 * 1024

    def __init__(self, num_heads, kv_lora_rank, qk_rope_head_dim, scale, layer, device):
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.scale = scale
        self.bmm1_scale = scale * getattr(layer, "_k_scale_float", 1.0)  # ok: FC103
        self.workspace_buffer = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
        self.decode_workspace = get_mla_decode_workspace(device, 132)

    def forward_decode(self, q, kv_c_and_k_pe_cache, attn_metadata: MLAMetadata):
        decode = attn_metadata.decode
        return trtllm_batch_decode_with_kv_cache_mla(
            query=q.unsqueeze(1),
            kv_cache=kv_c_and_k_pe_cache.unsqueeze(1),
            workspace_buffer=self.decode_workspace,
            qk_nope_head_dim=128,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            block_tables=decode.block_table,
            seq_lens=decode.seq_lens,
            max_seq_len=decode.max_seq_len,
            bmm1_scale=self.bmm1_scale,
        )
