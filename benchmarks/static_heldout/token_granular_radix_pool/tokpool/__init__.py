"""Token-granular KV memory (page size 1) with a radix-tree prefix cache."""
