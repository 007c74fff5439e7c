"""Which turn comes next: a cursor over a session's items, sub-agents included.

A session is a list of turns and nested sessions (sub-agents). A sub-agent runs to
completion before its parent's next item; each turn is released ``think_s`` after the
previous item of its session completed (closed loop). Pure bookkeeping: no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim.workload import Session, Turn


@dataclass
class Frame:
    session: Session
    pos: int = 0
    req: Any = None      # the core Request that carries this (sub-)session's pages
    state_at: int = -1   # tokens its request's stashed state stands for (engine.statemoves)


@dataclass
class Cursor:
    """Walks one top-level session depth-first. ``next_turn`` returns (frame, turn) or None."""

    root: Session
    sid: int
    stack: list[Frame] = field(default_factory=list)
    turn_index: int = 0

    def __post_init__(self) -> None:
        self.stack.append(Frame(self.root))

    def next_turn(self) -> tuple[Frame, Turn] | None:
        while self.stack:
            top = self.stack[-1]
            if top.pos >= len(top.session.items):
                return None  # the caller closes the frame (its request) and pops it
            item = top.session.items[top.pos]
            top.pos += 1
            if isinstance(item, Turn):
                self.turn_index += 1
                return top, item
            self.stack.append(Frame(item))
        return None

    def pop(self) -> Frame:
        return self.stack.pop()
