import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, MultiLevelCascadeAttentionWrapper
from flashinfer.decode import xqa_batch_decode_with_kv_cache

from rtp_llm.models_py.modules.fmha.attn_inputs import PyAttentionInputs
from rtp_llm.models_py.utils.workspace import get_gen_workspace, get_xqa_workspace, get_zero_workspace, get_zeroed_xqa_workspace


def kv_indptr_from_lengths(lengths_host, page_size):
    indptr = torch.zeros(lengths_host.shape[0] + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum((lengths_host + page_size - 1) // page_size, 0)
    return indptr


class PyFlashinferPrefillAttnOp:
    def __init__(self, config, device):
        self.config = config
        self.device = device
        ws = get_zero_workspace(device)
        self.wrappers = [BatchPrefillWithPagedKVCacheWrapper(ws, "HND", backend="fa3") for _ in range(2)]
        self.cascade = MultiLevelCascadeAttentionWrapper(2, ws, "HND")

    def prepare(self, attn_inputs: PyAttentionInputs):
        cfg = self.config
        bs = attn_inputs.input_lengths.size(0)
        max_q_len = int(attn_inputs.input_lengths.max())  # ok: FC101
        qo_indptr = attn_inputs.cu_seqlens[: bs + 1]
        qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        qo_indptr_host[1:] = torch.cumsum(attn_inputs.input_lengths, 0)
        kv_indptr_host = kv_indptr_from_lengths(attn_inputs.prefix_lengths + attn_inputs.input_lengths, cfg.page_size)
        last_page_len_host = (attn_inputs.prefix_lengths + attn_inputs.input_lengths - 1) % cfg.page_size + 1
        for w in self.wrappers[:1]:
            w.plan(qo_indptr, kv_indptr_host, attn_inputs.kv_cache_block_id_device, last_page_len_host, cfg.head_num, cfg.head_num_kv, cfg.size_per_head, cfg.page_size, causal=True)  # expect: FC102
        self.wrappers[1].plan(qo_indptr_host, kv_indptr_host, attn_inputs.kv_cache_block_id_device, last_page_len_host, cfg.head_num, cfg.head_num_kv, cfg.size_per_head, cfg.page_size, causal=True, window_left=cfg.sliding_window)  # ok: FC102
        shared_qo_indptr = torch.tensor([0, qo_indptr_host[-1]], dtype=torch.int32)
        self.cascade.plan([shared_qo_indptr, qo_indptr], [kv_indptr_host[:2], kv_indptr_host], [attn_inputs.kv_cache_block_id_device] * 2, [last_page_len_host[:1], last_page_len_host], cfg.head_num, cfg.head_num_kv, cfg.size_per_head, cfg.page_size)  # expect: FC102
        position_ids_np = attn_inputs.position_ids.cpu().numpy()  # expect: FC101
        seq_lens = attn_inputs.sequence_lengths.tolist()  # ok: FC101
        return max_q_len, position_ids_np, seq_lens


class PyFlashinferDecodeAttnOp:
    def __init__(self, config, max_bs, device):
        self.config = config
        self.device = device
        max_pages = max_bs * config.max_seq_len // config.page_size
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            get_gen_workspace(str(device)),
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr_buf,
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.kv_last_page_len_buf,
            backend="trtllm-gen",
        )
        self.xqa_ws = get_xqa_workspace(device, config.max_num_tokens, config.head_num, config.size_per_head, zeroed=False)
        self.xqa_ws_zeroed = get_zeroed_xqa_workspace(device, config.max_num_tokens, config.head_num, config.size_per_head)

    def prepare(self, attn_inputs: PyAttentionInputs):
        bs = attn_inputs.sequence_lengths.size(0)
        self.kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        return self.prepare_cuda_graph(attn_inputs)

    def prepare_cuda_graph(self, attn_inputs: PyAttentionInputs):
        cfg = self.config
        bs = attn_inputs.sequence_lengths.size(0)
        lengths = attn_inputs.sequence_lengths + 1
        self.kv_indptr_buf[1 : bs + 1].copy_(torch.cumsum((lengths + cfg.page_size - 1) // cfg.page_size, 0).to(self.device))  # ok: FC104
        self.kv_indptr_host[: bs + 1].copy_(self.kv_indptr_buf[: bs + 1])  # expect: FC101
        kv_indices = self.kv_indices_buf[: self.kv_indptr_buf[bs]]  # expect: FC101
        last_page_len_host = (lengths - 1) % cfg.page_size + 1
        self.decode_wrapper.plan(self.kv_indptr_host[: bs + 1], kv_indices, last_page_len_host, cfg.head_num, cfg.head_num_kv, cfg.size_per_head, cfg.page_size)  # ok: FC102
        self.kv_last_page_len_buf[bs:].fill_(1)  # expect: FC104

    def forward_xqa(self, q, kv_cache, block_tables, seq_lens, max_seq_len):
        out = xqa_batch_decode_with_kv_cache(q, kv_cache, self.xqa_ws, block_tables, seq_lens, max_seq_len)
        return out + xqa_batch_decode_with_kv_cache(q, kv_cache, self.xqa_ws_zeroed, block_tables, seq_lens, max_seq_len)
