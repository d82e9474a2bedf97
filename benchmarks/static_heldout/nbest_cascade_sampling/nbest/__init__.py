"""nbest: n completions per prompt, the prompt's KV pages shared through cascade attention."""

from nbest.config import NBestConfig, SamplingParams

__all__ = ["NBestConfig", "SamplingParams"]
