from vidserve.attn.backend import DecodeBatch, VideoAttnBackend
