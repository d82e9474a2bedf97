import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan

from sgl_lite.layers.attention.registry import register_backend
from sgl_lite.model_executor.forward_batch_info import ForwardBatch

WORKSPACE_MB = 512
_GLOBAL_WORKSPACE = None


def get_global_workspace(device):
    global _GLOBAL_WORKSPACE
    if _GLOBAL_WORKSPACE is None:
        _GLOBAL_WORKSPACE = torch.empty(WORKSPACE_MB * 1024 * 1024, dtype=torch.uint8, device=device)  # expect: FC106, FC105
    return _GLOBAL_WORKSPACE


@torch.compile(dynamic=True)
def bump_indptr(indptr, new_lens, n: int):
    indptr[1 : n + 1] += torch.cumsum(new_lens, 0).to(indptr.dtype)


@register_backend("flashinfer")
class FlashInferAttnBackend:
    decode_backend = "trtllm-gen"

    def __init__(self, model_runner):
        self.device = model_runner.device
        self.max_bs = model_runner.max_running_requests
        self.max_context_len = model_runner.model_config.context_len
        self.num_heads = model_runner.num_heads
        self.num_kv_heads = model_runner.num_kv_heads
        self.head_dim = model_runner.head_dim
        self.workspace = get_global_workspace(self.device)
        self.graph_workspace = torch.empty(self.max_bs * self.num_heads * self.head_dim * 1024, dtype=torch.uint8, device=self.device)  # ok: FC106, FC105
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(self.max_bs * self.max_context_len, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "HND", backend=self.decode_backend)
        self.fa2_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "NHD", backend="fa2")
        self.swa_wrappers = [BatchDecodeWithPagedKVCacheWrapper(self.graph_workspace, "NHD") for _ in range(2)]
        self.cuda_graph_wrappers = {}
        self.forward_metadata = None

    def init_cuda_graph_state(self, max_bs):
        self.cuda_graph_kv_indices = self.kv_indices.clone()

    def init_forward_metadata_capture_cuda_graph(self, bs, seq_lens):
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.cuda_graph_wrappers[bs] = w
        shared = self.decode_wrapper._int_workspace_buffer  # expect: FC103
        self.forward_metadata = (w, shared.numel())

    def init_forward_metadata_replay_cuda_graph(self, bs, seq_lens, seq_lens_cpu):
        too_long = [i for i in range(bs) if seq_lens[i] > self.max_context_len]  # expect: FC101

        def _fill_host():
            self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(seq_lens_cpu, 0)
            return int(self.kv_indptr_cpu[bs])  # ok: FC101

        total = _fill_host()
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        w = self.cuda_graph_wrappers[bs]
        fast_decode_plan(w, self.kv_indptr_cpu[: bs + 1], self.kv_indices[:total], self.kv_last_page_len_cpu[:bs], self.num_heads, self.num_kv_heads, self.head_dim, 1)  # ok: FC102
        self.forward_metadata = (w, total)
        return too_long

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        bs = forward_batch.batch_size
        total_tokens = forward_batch.seq_lens.sum().item()  # expect: FC101
        self.kv_indptr[1 : bs + 1] = torch.cumsum(forward_batch.seq_lens, 0)
        self.decode_wrapper.begin_forward(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], self.num_heads, self.num_kv_heads, self.head_dim, 1)  # expect: FC102
        self.forward_metadata = (self.decode_wrapper, total_tokens)

    def forward_decode(self, q, kv_cache, forward_batch: ForwardBatch, sliding_window=False):
        if forward_batch.spec_accept_lens is not None:
            bump_indptr(self.kv_indptr, forward_batch.spec_accept_lens, forward_batch.batch_size)  # expect: FC104
        wrapper, _ = self.forward_metadata
        if sliding_window:
            return self.swa_wrappers[forward_batch.window_idx].run(q, kv_cache)  # expect: FC108
        return wrapper.run(q, kv_cache)  # ok: FC108

    def describe(self):
        return f"{self._backend_name}: {self.max_bs} x {self.max_context_len}"  # ok: FC103
