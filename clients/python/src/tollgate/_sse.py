"""Server-sent events of ``GET /v1/tasks/{id}/events`` (docs/api.md, "Streaming a task"),
read line by line: each event as ``{"event": name, "data": parsed JSON}``."""

from __future__ import annotations

import json
from typing import Any, Literal, TypedDict, cast


class TaskStreamEvent(TypedDict):
    """One event of a task's stream: ``delta`` (``{"text"}`` or ``{"tool_call"}``: a piece of
    the output), ``restart`` (``{"reason"}``: the deltas so far are void) or ``end`` (the task,
    as :meth:`~tollgate.Tollgate.get_task` answers it; the last event)."""

    event: Literal["delta", "restart", "end"]
    data: Any


class SseLines:
    """Turns the body's lines into events (a blank line ends one; ``:`` lines are comments)."""

    def __init__(self) -> None:
        self._name = "message"
        self._data: list[str] = []

    def line(self, line: str) -> TaskStreamEvent | None:
        line = line.rstrip("\r\n")
        if line == "":
            return self.flush()
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None

    def flush(self) -> TaskStreamEvent | None:
        name, data = self._name, self._data
        self._name, self._data = "message", []
        if not data:
            return None
        return cast(TaskStreamEvent, {"event": name, "data": json.loads("\n".join(data))})
