from asrserve.encoder.conformer import StreamingEncoder
from asrserve.encoder.pages import EncoderPageTable

__all__ = ["EncoderPageTable", "StreamingEncoder"]
