"""Recently computed prompt prefixes as chained hashes of fixed-size token blocks, least recently used dropped beyond
a capacity: the simulated server's prefix cache (engines/sim/scheduler.py) and the router's picture of each worker's
(router/policies.PrefixAware), both stand-ins for SGLang's radix cache (on by default; it evicts its tree LRU when the
KV pool needs room, here simply capped).

A prompt matches block by block from its start, so each block's hash chains every block before it; a tail shorter
than a block is never cached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixBlocks:
    """The prompt prefixes one server computed (or one worker was sent), at most `capacity_blocks` blocks."""

    def __init__(self, block_tokens: int, capacity_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def chain(self, ids: Sequence[int]) -> list[int]:
        """The chained hash of every whole block of `ids`, first block first."""
        out, h = [], 0
        for start in range(0, len(ids) - len(ids) % self.block_tokens, self.block_tokens):
            h = hash((h, tuple(ids[start:start + self.block_tokens])))
            out.append(h)
        return out

    def matched_blocks(self, chain: list[int], touch: bool = False) -> int:
        """Leading blocks of `chain` held; `touch`: they become the most recent (a cache hit, not a look)."""
        n = 0
        for h in chain:
            if h not in self._blocks:
                break
            if touch:
                self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(self, chain: list[int]) -> None:
        """Hold every block of `chain` as the most recent, dropping the least recently used beyond capacity."""
        for h in chain:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
