"""The router's JSON responses, rendered by orjson (~10x faster than the json module on engine answers)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse


def json_bytes(obj: Any) -> bytes:
    """Compact JSON of `obj` by orjson; the json module where orjson refuses (an integer beyond 64 bits,
    which a client may send in fields passed through to the engine)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body orjson renders (compact, UTF-8, same JSON)."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)
