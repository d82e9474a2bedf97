from podserve.attn.pod_backend import DecodeMetadata, MixedMetadata, PodAttnBackend

__all__ = ["DecodeMetadata", "MixedMetadata", "PodAttnBackend"]
