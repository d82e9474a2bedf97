import time


class RadixNode:
    __slots__ = ("key", "pages", "children", "parent", "ref", "last_access")

    def __init__(self, key=(), pages=(), parent=None):
        self.key = tuple(key)  # tokens, a whole number of pages
        self.pages = list(pages)
        self.children = {}
        self.parent = parent
        self.ref = 0
        self.last_access = time.monotonic()

    def is_leaf(self):
        return not self.children
