"""gbserve: grammar-constrained decoding with token bitmasks, jump-forward and FlashInfer decode graphs."""
