import torch


def create_flashinfer_kv_indices(req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_indices):
    rows = req_to_token[req_pool_indices]
    torch.ops.sgl_kernel.gather_kv_indices(rows, paged_kernel_lens, kv_indptr, kv_indices)


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
    """A faster decode plan for graph replay: skips the argument checks of the wrapper's own plan()."""
    batch_size = len(last_page_len)
    if self.is_cuda_graph_enabled:
        self._paged_kv_last_page_len_buf.copy_(last_page_len, non_blocking=True)  # expect: FC103
    self._plan_info = self._cached_module.plan(self._float_workspace_buffer, indptr, batch_size, num_qo_heads, num_kv_heads, page_size)  # expect: FC103
