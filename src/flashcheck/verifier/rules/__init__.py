"""Static rules FC100-FC199, one per module; each module registers its rule (and its page) when imported."""
