"""The seam: what the engine needs from time (Runtime) and from bytes (Backend).

The engine is a set of SimPy-style generator processes. It knows time only through a
Runtime and moves bytes only through a Backend. The sim backend pairs a SimPy environment
with a model of the hardware; the hw backend pairs a real-time driver with CuPy/numpy
buffers and files. Nothing outside backend construction asks which one it has.

Waitables are whatever the runtime's ``timeout``/``event``/``all_of``/``any_of``/
``process`` return; a generator process yields them and is resumed with their value.
A transfer's or compute's waitable succeeds with ``True`` when the work completed and
``False`` when it failed (the failure is reported, never raised into the engine).
``StepWork`` (``kvsim.core.datapath.work``, re-exported here) is what one engine step
computes, as the engine hands it to ``compute`` and ``compute_ahead``.
"""

from __future__ import annotations

from typing import Any, Callable, Generator, Iterable, Protocol, Sequence, runtime_checkable

from kvsim.core.datapath.fill import FillLayout
from kvsim.core.datapath.work import StepWork
from kvsim.core.plan import Batch, Fill
from kvsim.core.spec import Level

__all__ = ["Backend", "CapacityError", "Process", "Runtime", "StepWork", "Waitable"]

Waitable = Any
Process = Generator[Waitable, Any, Any]


class CapacityError(ValueError):
    """A backend cannot give what the configuration asks (a tier larger than the free
    device memory, available host memory or free disk space). Raised before anything is
    allocated; the message names the tier's config key, the quota and what is available."""


@runtime_checkable
class Runtime(Protocol):
    """Time, as the engine may see it."""

    @property
    def now(self) -> float: ...

    def timeout(self, delay_s: float, value: Any = None) -> Waitable: ...

    def event(self) -> Waitable:
        """A waitable the engine triggers itself with ``.succeed(value)``."""

    def all_of(self, waitables: Iterable[Waitable]) -> Waitable: ...

    def any_of(self, waitables: Iterable[Waitable]) -> Waitable: ...

    def process(self, gen: Process) -> Waitable:
        """Start a generator process; the waitable succeeds with its return value."""

    def run(self, until: Waitable | float | None = None) -> None:
        """Drive the processes until ``until`` (an event or a time) or until idle."""

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """A part of the node that its ranks share (a disk drive, the driver's lock): the
        one ``make()`` built when a backend on this runtime first asked for ``name``. A
        runtime is one node's clock, so what it holds is that node's."""


@runtime_checkable
class Backend(Protocol):
    """Bytes, as the engine may move them."""

    name: str
    runtime: Runtime
    errors: Any  # a sequence of what failed, newest last (reported, never raised)

    def transfer(self, batch: Batch) -> Waitable:
        """Move one batch of pages. Succeeds with True, or False if the batch failed."""

    def compute(self, duration_s: float, work: StepWork | None = None) -> Waitable:
        """Run one step's model compute for ``duration_s`` (the compute model's estimate;
        the sim may stretch it under contention). ``work``: what the step computes (the
        compute model's ``StepWork``: FLOPs, bytes, tokens); the hw backend runs a stand-in
        of it (GEMMs and HBM reads, ``kvsim_backends.hw.standin``), the sim stretches it
        by its kind. None: a load of the SMs alone (the hw backend's FMA kernel), for tests
        and benchmarks that need one. Succeeds with the seconds it took."""

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool,
                      work: StepWork | None = None) -> float | None:
        """Run-ahead: the engine computes steps before the runtime's clock reaches them, and
        asks when a compute of ``seconds`` (of ``work``, as ``compute``) started at
        ``start_s`` (at or after ``now``; nothing submitted since the last run-ahead step)
        would end. The answer is the end time if the backend can tell for certain that
        nothing it runs changes before then (the compute is then accounted as if it had
        run); None if it cannot, and the engine catches up and yields ``compute``
        instead. ``quiet``: the engine has nothing in flight on the backend, so no pending
        event of the backend's can matter."""

    def catch_up(self, until_s: float) -> Waitable:
        """After a run-ahead: bring the runtime's clock to ``until_s`` (the sim lands on
        exactly that time; the hw backend spends the span computing the work of the steps
        it ran ahead on the GPU)."""

    def fill(self, fill: Fill) -> None:
        """Write freshly computed pages' content (their tags) into their slots."""

    def read_tags(self, level: Level, slots: Sequence[int]) -> Sequence[int]:
        """Content tags found in the slots (the sim: a list of ints; hw: a uint64 array):
        the refcheck compares them (``kvsim.engine.refcheck``)."""

    def read_tags_later(self, level: Level, slots: Sequence[int]) -> Waitable | None:
        """``read_tags`` without holding the runtime: a waitable that succeeds with the tags
        found (the hw backend checks on the GPU or an I/O thread while the loop runs on),
        or None where ``read_tags`` itself is immediate (the sim: tags, no bytes)."""

    def slots_ready(self, level: Level, slots: Sequence[int]) -> Waitable | None:
        """Whether ``slots`` of the tier at ``level`` exist yet (a host tier that fills
        progressively, ``kvsim.core.datapath.fill``): None if they do (a tier without a fill
        always); else a waitable that succeeds with True once they do, or with False if
        they never will (the fill failed below them: ``slot_limit`` says how far it got)."""

    def slot_limit(self, level: Level) -> int | None:
        """The slots of the tier at ``level`` that will ever exist, where its fill failed
        (the committed prefix); None where nothing failed."""

    def fill_layout(self, level: Level) -> FillLayout | None:
        """The units the tier at ``level`` fills in (``kvsim.core.datapath.fill.layout_for``,
        as this backend laid them out: the hw backend's with the driver's granule), or None
        where it exists whole from the start. The engine's serve watermark reads it."""

    def promote(self, batch: Batch) -> int:
        """A background write to disk (``BatchKind.BACKGROUND``) that a required one came
        to depend on: its pieces still queued move to the required writes' queue (with
        prioritised disk I/O; else nothing to do). How many moved."""

    def stats(self) -> dict:
        """Cumulative counters (numbers), at least the bytes moved as ``host_to_gpu``,
        ``gpu_to_host``, ``disk_read`` and ``disk_write``; the timeline samples them."""

    def close(self) -> None: ...
