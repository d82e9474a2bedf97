"""hgs: heterogeneous split serving (prefill GPU -> decode GPU) over FlashInfer."""
