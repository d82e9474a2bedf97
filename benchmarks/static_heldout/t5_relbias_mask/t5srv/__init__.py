"""T5 encoder-decoder serving on FlashInfer."""
from t5srv.config import ServeLimits, T5Config
from t5srv.runner import T5Server

__all__ = ["ServeLimits", "T5Config", "T5Server"]
