from penaltyserve.attn.backend import DecodeAttnBackend, DecodeInputs, GraphView

__all__ = ["DecodeAttnBackend", "DecodeInputs", "GraphView"]
