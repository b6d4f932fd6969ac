"""How a ServerSpec knob is declared (its SGLang flag and the config fields it comes from), and the first group of
knobs, the parallel shape, which WorkerGroup also reads for its GPU counts (server_spec.py holds the other groups).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any


def knob(flag: str, *source: str, default: Any = None, aliases: tuple[str, ...] = (), sim_only: bool = False,
         unwritten: Any = None) -> Any:
    """A spec field: its SGLang flag (a sim-only flag when SGLang takes the value elsewhere or not at all), the config
    fields it comes from ('group.x' or 'engine.sglang.x', first one set wins), the flag's other spellings, and the
    value left off the command line (besides None and False) because it is SGLang's default and single-node argv
    never carried it."""
    return dataclass_field(default=default, metadata={"flag": flag, "source": source, "aliases": aliases,
                                                      "sim_only": sim_only, "unwritten": unwritten})


@dataclass(frozen=True)
class Parallelism:
    tp: int = knob("--tp-size", "group.tp", default=1, aliases=("--tp",))
    pp: int = knob("--pp-size", "group.pp", default=1, aliases=("--pp",))
    dp: int = knob("--dp-size", "group.dp", default=1, aliases=("--dp",))
    ep: int = knob("--ep-size", "group.ep", default=1, aliases=("--ep",))
    dp_attention: bool = knob("--enable-dp-attention", "group.dp_attention", default=False)
    nnodes: int = knob("--nnodes", "group.nnodes", default=1, unwritten=1)
    moe_a2a_backend: str | None = knob("--moe-a2a-backend", "group.moe_a2a_backend")

    @property
    def gpus(self) -> int:
        """GPUs of one server: tp x pp per model copy, dp copies unless DP attention splits one copy's attention."""
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def gpus_per_node(self) -> int:
        """GPUs one server takes on each of its nodes (a server spanning nodes splits them evenly)."""
        return -(-self.gpus // self.nnodes)
