from eelayers.attn.groups import LayerGroupAttention

__all__ = ["LayerGroupAttention"]
