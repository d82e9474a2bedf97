from cfgserve.attention.backend import PairAttnBackend

__all__ = ["PairAttnBackend"]
