from .flashinfer_encdec import EncDecMetadata, FlashInferEncDecBackend  # noqa: F401
