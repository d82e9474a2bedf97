"""rlroll: the rollout side of a GRPO trainer (N sampled completions per prompt, token logprobs, weight sync)."""
