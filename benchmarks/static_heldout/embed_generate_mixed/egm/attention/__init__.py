from egm.attention.flashinfer_backend import MixedFlashInferBackend, StepMeta

__all__ = ["MixedFlashInferBackend", "StepMeta"]
