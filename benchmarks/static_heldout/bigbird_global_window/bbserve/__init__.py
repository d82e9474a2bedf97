"""bbserve: long-context decoding with a sliding window plus global and random pages.

Every decode row attends three page sets and merges them by log-sum-exp: the pages under its
sliding window, a block-sparse set of "global" pages (the prompt's first pages plus the
highest-scoring far pages, re-selected every step) and BigBird-style random far pages.
"""
