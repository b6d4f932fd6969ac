"""The router's JSON responses, rendered by orjson (~10x faster than the json module on engine answers)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import JSONResponse


class FastJSONResponse(JSONResponse):
    """A JSONResponse whose body orjson renders (compact, UTF-8, same JSON)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
