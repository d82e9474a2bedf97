"""wmserve: Kirchenbauer-style green-list watermarking on a FlashInfer decode server."""
