from modserve.models.llama import LlamaForCausalLM
from modserve.models.lookahead import LookaheadHead

__all__ = ["LlamaForCausalLM", "LookaheadHead"]
