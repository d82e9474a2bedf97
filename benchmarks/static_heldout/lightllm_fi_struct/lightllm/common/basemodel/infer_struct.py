import torch


class InferStateInfo:
    """Per-step state shared by every layer of one forward."""

    def __init__(self):
        self.batch_size = None
        self.total_token_num = None
        self.is_prefill = None
        self.b_req_idx = None
        self.b_start_loc = None
        self.b_seq_len = None
        self.b_seq_len_cpu = None
        self.b_ready_cache_len = None
        self.max_len_in_batch = None
        self.req_manager = None
        self.microbatch_index = 0

    def init_some_extra_state(self, model, input_ids: torch.Tensor):
        if self.is_prefill:
            self.b_q_seq_len = self.b_seq_len - self.b_ready_cache_len
            self.max_q_seq_len = int(self.b_q_seq_len.max())  # expect: FC101
        else:
            self.max_q_seq_len = 1
        self.max_len_in_batch = int(self.b_seq_len_cpu.max())  # ok: FC101

    def copy_for_cuda_graph(self, new_infer_state: "InferStateInfo"):
        for attr_name, attr_value in vars(new_infer_state).items():
            if isinstance(attr_value, torch.Tensor):
                attr = getattr(self, attr_name, None)
                if attr is not None and attr.data_ptr() != attr_value.data_ptr():
                    attr.copy_(attr_value, non_blocking=True)
