from .modeling_llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
