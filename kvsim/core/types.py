"""Enums for page and request states (explicit states rather than nullable fields)."""

import enum


class Phase(enum.IntEnum):
    """Where a page's bytes are in their life cycle."""

    PENDING = 0   # a new page whose slot is reserved by a plan that has not completed
    RESIDENT = 1  # bytes at rest in (level, slot)
    MOVING = 2    # source of an in-flight move: pinned, cannot be evicted or locked
    DROPPED = 3   # removed from every tier; the object is dead
    FREED = 4     # released without ever being cached (private page of a closed request)


class PageState(enum.IntEnum):
    """Who keeps a live page: exactly one of these holds for every live page."""

    LOCKED = 0     # used by an active request: on GPU, cannot move
    HELD = 1       # owned by a suspended request: may move colder, may not be dropped
    DROPPABLE = 2  # only the prefix tree refers to it


class ReqState(enum.IntEnum):
    SUSPENDED = 0  # pages held (created, or between turns)
    RESUMING = 1   # a resume plan is in flight
    ACTIVE = 2     # pages locked on GPU
    GROWING = 3    # a grow plan is in flight (pages stay locked)
    CLOSED = 4
