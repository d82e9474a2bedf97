import logging

import torch
from torch.cuda import synchronize as cuda_sync

from vllm import envs
from vllm.v1.attention.backends.utils import CommonAttentionMetadata

logger = logging.getLogger(__name__)


class EagleProposer:
    def __init__(self, vllm_config, device, runner=None):
        self.device = device
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.hidden_states = torch.zeros((self.max_num_tokens, vllm_config.model_config.hidden_size), device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.prev_last_token_indices = None
        self.model = None

    def load_model(self, target_model):
        self.model = target_model.draft
        probe = torch.ones(1, device=self.device)
        logger.debug("eagle draft loaded, probe=%s", probe.item())  # ok: FC101
        cuda_sync()  # ok: FC101

    def propose(self, target_token_ids, target_positions, target_hidden_states, next_token_ids, common_attn_metadata: CommonAttentionMetadata):
        last_token_indices = common_attn_metadata.query_start_loc[1:] - 1
        if self.prev_last_token_indices is not None and torch.equal(last_token_indices, self.prev_last_token_indices):  # expect: FC101
            logger.warning("eagle: batch unchanged since the last step")
        self.prev_last_token_indices = last_token_indices
        num_tokens = target_token_ids.shape[0]
        self.positions[:num_tokens] = target_positions
        hidden_states = self.model(target_token_ids, self.positions[:num_tokens], target_hidden_states)
        draft_token_ids = self.model.compute_logits(hidden_states[last_token_indices]).argmax(dim=-1)
        draft_token_ids_list = [draft_token_ids]
        positions = target_positions[last_token_indices]  # ok: FC101
        for step in range(self.num_speculative_tokens - 1):
            positions = positions + 1
            exceeds_max_model_len = positions >= self.max_model_len
            clamped_positions = torch.where(exceeds_max_model_len, 0, positions)  # ok: FC101
            if exceeds_max_model_len.any():  # expect: FC101
                logger.debug(f"step {step}: clamped {int(exceeds_max_model_len.sum())} positions")  # expect: FC101
            common_attn_metadata.seq_lens += 1
            common_attn_metadata.seq_lens_cpu += 1
            common_attn_metadata.max_seq_len = min(common_attn_metadata.max_seq_len + 1, self.max_model_len)  # ok: FC101
            hidden_states = self.model(draft_token_ids_list[-1], clamped_positions, hidden_states)
            draft_token_ids_list.append(self.model.compute_logits(hidden_states).argmax(dim=-1))
        if envs.VLLM_EAGLE_SYNC_DEBUG:
            cuda_sync()  # expect: FC101
        return torch.stack(draft_token_ids_list, dim=1)
