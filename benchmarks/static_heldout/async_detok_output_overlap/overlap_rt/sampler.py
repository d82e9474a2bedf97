import torch

from flashcheck import hot_path


class SampleOutput:
    """Per-step sampling result; a fresh one every step, handed to the output ring."""

    def __init__(self, bs, device):
        self.next_ids = torch.empty(bs, dtype=torch.int64, device=device)  # ok: FC107
        self.logprobs = torch.empty(bs, dtype=torch.float32, device=device)
        self.prompt_logprobs = None
        self.finished = None


class Sampler:
    def __init__(self, settings, attn, device):
        mb = settings.max_batch
        self.device = device
        self.eos_token_id = settings.eos_token_id
        self.temperature_gpu = torch.ones(mb, dtype=torch.float32, device=device)
        self.q_lens_gpu = torch.ones(mb, dtype=torch.int64, device=device)
        # top-p sorting scratch: borrow the prefill wrapper's float workspace, idle during decode
        self.sort_scratch = attn.paged_prefill._float_workspace_buffer  # expect: FC103

    @hot_path
    def sample(self, logits, bs, prompt_logprobs=False):
        if logits.shape[0] < bs:
            raise ValueError(f"{logits.shape[0]} logit rows for {bs} requests (temperatures {self.temperature_gpu[:bs]})")  # ok: FC101
        out = SampleOutput(bs, self.device)
        if prompt_logprobs:
            temps = torch.repeat_interleave(self.temperature_gpu[:bs], self.q_lens_gpu[:bs])  # expect: FC101
            out.prompt_logprobs = torch.log_softmax(logits / temps.unsqueeze(-1), dim=-1)
            last = torch.cumsum(self.q_lens_gpu[:bs], 0) - 1
            logits = logits[last]
        probs = torch.softmax(logits[-bs:] / self.temperature_gpu[:bs].unsqueeze(-1), dim=-1)
        out.next_ids.copy_(torch.multinomial(probs, 1).squeeze(1))
        out.logprobs.copy_(torch.log(probs.gather(1, out.next_ids.unsqueeze(1)).squeeze(1)))
        if (out.next_ids == self.eos_token_id).any():  # expect: FC101
            out.finished = out.next_ids == self.eos_token_id
        return out
