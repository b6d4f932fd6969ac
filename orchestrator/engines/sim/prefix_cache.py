"""The simulated server's prefix cache: prompt prefixes it computed recently count as cached, as in
SGLang's radix cache (on by default), so a prefill computes only the rest of the prompt.

Prefixes are kept as chained hashes of `block_tokens`-token blocks (a prompt matches block by block from
its start), least recently used blocks dropped beyond `capacity_tokens` (SGLang evicts its tree LRU when
the KV pool needs room; here the cache is simply capped at the pool's size).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

BLOCK_TOKENS = 16


class PrefixCache:
    """Cached prompt prefixes of one server; `match` says how many leading tokens of a prompt are cached."""

    def __init__(self, capacity_tokens: int, block_tokens: int = BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self.capacity_blocks = max(0, capacity_tokens // block_tokens)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _chain(self, ids: Sequence[int]):
        h = 0
        for start in range(0, len(ids) - self.block_tokens + 1, self.block_tokens):
            h = hash((h, tuple(ids[start:start + self.block_tokens])))
            yield h

    def match(self, ids: Sequence[int]) -> int:
        """Leading tokens of `ids` that are cached (whole blocks); the matched blocks become most recent."""
        n = 0
        for h in self._chain(ids):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n * self.block_tokens

    def insert(self, ids: Sequence[int]) -> None:
        """Remember every whole block of a computed prompt, dropping the least recently used beyond capacity."""
        for h in self._chain(ids):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
