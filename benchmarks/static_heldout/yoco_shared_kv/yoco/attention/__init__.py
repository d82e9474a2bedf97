from yoco.attention.yoco_backend import YocoAttnBackend

__all__ = ["YocoAttnBackend"]
