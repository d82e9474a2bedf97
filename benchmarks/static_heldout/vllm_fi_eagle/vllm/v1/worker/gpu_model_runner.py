import numpy as np
import torch

from vllm.v1.attention.backends.flashinfer import FlashInferMetadataBuilder
from vllm.v1.attention.backends.utils import CommonAttentionMetadata
from vllm.v1.spec_decode.eagle import EagleProposer


class GPUModelRunner:
    def __init__(self, vllm_config, kv_cache_spec, device):
        self.device = device
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.builder = FlashInferMetadataBuilder(kv_cache_spec, vllm_config, device)
        self.drafter = EagleProposer(vllm_config, device, self)
        self.query_start_loc_cpu = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, pin_memory=True)
        self.query_start_loc = torch.zeros(self.max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.num_accepted_cpu = torch.zeros(self.max_num_reqs, dtype=torch.int64, pin_memory=True)
        self.num_accepted = torch.zeros(self.max_num_reqs, dtype=torch.int64, device=device)
        max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)

    def execute_model(self, scheduler_output, block_table, slot_mapping):
        num_reqs = len(scheduler_output.num_scheduled_tokens)
        tokens = np.asarray(scheduler_output.num_scheduled_tokens, dtype=np.int32)
        np.cumsum(tokens, out=self.query_start_loc_cpu.numpy()[1 : num_reqs + 1])  # ok: FC101
        self.query_start_loc[: num_reqs + 1].copy_(self.query_start_loc_cpu[: num_reqs + 1], non_blocking=True)
        self.seq_lens[:num_reqs].copy_(self.seq_lens_cpu[:num_reqs], non_blocking=True)
        meta = CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: num_reqs + 1],
            seq_lens=self.seq_lens[:num_reqs],
            seq_lens_cpu=self.seq_lens_cpu[:num_reqs],
            num_reqs=num_reqs,
            num_actual_tokens=int(tokens.sum()),  # ok: FC101
            max_query_len=int(tokens.max()),
            max_seq_len=int(self.seq_lens_cpu[:num_reqs].max()),  # ok: FC101
            block_table_tensor=block_table,
            slot_mapping=slot_mapping,
        )
        self.builder.build(0, meta)
        num_tokens = int(tokens.sum())
        input_ids, positions = self.input_ids[:num_tokens], self.positions[:num_tokens]
        sampled, hidden = scheduler_output.sample(input_ids, positions)
        torch.sum(sampled != -1, dim=1, out=self.num_accepted[:num_reqs])
        self.num_accepted_cpu[:num_reqs].copy_(self.num_accepted[:num_reqs], non_blocking=True)
        accepted = self.num_accepted_cpu[:num_reqs].tolist()  # expect: FC101
        drafts = self.drafter.propose(input_ids, positions, hidden, sampled[:, -1], meta)
        return accepted, drafts
