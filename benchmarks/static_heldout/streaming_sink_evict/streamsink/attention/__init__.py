from streamsink.attention.sink_backend import SinkFlashInferBackend

__all__ = ["SinkFlashInferBackend"]
