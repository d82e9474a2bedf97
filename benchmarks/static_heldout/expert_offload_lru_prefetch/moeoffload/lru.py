from collections import OrderedDict


class ExpertLRU:
    """LRU over the GPU expert slots, keyed by (layer, expert). Pure host bookkeeping."""

    def __init__(self, num_slots):
        self.num_slots = num_slots
        self.order = OrderedDict()
        self.free = list(range(num_slots - 1, -1, -1))
        self.pinned = set()
        self.hits = 0
        self.misses = 0

    def lookup(self, key):
        slot = self.order.get(key)
        if slot is not None:
            self.order.move_to_end(key)
            self.hits += 1
        return slot

    def admit(self, key):
        """Give `key` a slot; returns (slot, evicted key or None)."""
        self.misses += 1
        if self.free:
            slot = self.free.pop()
            self.order[key] = slot
            return slot, None
        victim = None
        for candidate in self.order:
            if candidate not in self.pinned:
                victim = candidate
                break
        if victim is None:
            raise RuntimeError(f"all {self.num_slots} GPU expert slots are pinned by the current step")
        slot = self.order.pop(victim)
        self.order[key] = slot
        self._check()
        return slot, victim

    def pin(self, keys):
        # the experts the current step routes to must not be evicted by its own loads
        assert len(keys) <= self.num_slots  # expect: FC109
        self.pinned = set(keys)

    def unpin_all(self):
        self.pinned.clear()

    def _check(self):
        used = len(self.free) + len(self.order)
        assert used == self.num_slots  # ok: FC109
