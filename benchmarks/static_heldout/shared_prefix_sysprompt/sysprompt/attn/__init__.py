from sysprompt.attn.cascade_backend import ForwardBatch, PrefixGroup, SharedPrefixBackend

__all__ = ["ForwardBatch", "PrefixGroup", "SharedPrefixBackend"]
