"""The base of every config section: an unknown key is an error (a typo never silently falls back to a default),
and an assignment is validated like the file was."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
