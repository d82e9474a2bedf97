"""TP x PP serving: configuration, per-micro-batch metadata and stage communication."""
