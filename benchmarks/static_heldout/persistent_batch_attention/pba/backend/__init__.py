from pba.backend.holistic import HolisticAttnBackend

__all__ = ["HolisticAttnBackend"]
