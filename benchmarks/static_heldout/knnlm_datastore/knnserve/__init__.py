"""knnserve: kNN-LM serving (Khandelwal et al.) with FlashInfer decode graphs."""
