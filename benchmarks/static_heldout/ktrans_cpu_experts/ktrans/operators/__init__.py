from .flashinfer_mla import MLAWrapper, MLAWrapperSingleton  # noqa: F401
