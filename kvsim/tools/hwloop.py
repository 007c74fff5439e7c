"""The hw backend's own host costs, as ``kvsim compare``'s sim side predicts them.

The sim backend models hardware. A replay on the hw backend also spends time in its own
software: the engine loop runs the core's bookkeeping on the loop's thread, a copy call and
its completion's wake-up take longer between engine steps than in a tight loop of copies,
a disk batch waits for an I/O thread and for the loop to see it done, and the refcheck runs
a kernel (or an I/O thread) the loop launches and then polls. None of that is hardware, so
none of it is in the hardware profile. ``HwLoopModel`` is that software's cost, a spec of
its own (YAML under ``configs/hwloop/``: ``kvsim compare`` uses ``h200``); ``HwLoop``
is one replay's account of it, which ``kvsim compare`` hands to the sim backend (the
backend registry wraps the sim backend in ``kvsim_backends.sim.loopcosts.HwLoopSim``) and to
the engine (``Engine.on_resume``).

What the model charges (all default 0: the loop costs nothing):

- ``resume`` + ``resume_per_page`` x pages: the loop's host time when the engine resumes a
  request that holds pages on the GPU; the next compute starts that much later (on hw the
  compute stream sits idle meanwhile: the hw compute log's host lag measures it).
- ``refcheck.launch_per_page`` x pages: the loop's host time when it launches a check of
  GPU pages (gathering and uploading their expected tags), added to the same hold.
- ``transfer``: added to the completion of every transfer with a GPU leg (GPU <-> host,
  GPU <-> disk) beyond the profile's ``transfer.latency``, which ``kvsim calibrate``
  measures in a tight loop of copies.
- ``disk``: added to the completion of every transfer with a disk leg, beyond the disk's
  own time (the I/O thread's wait and the loop seeing the completion).
- ``refcheck.latency`` / ``refcheck.ctas``: a check the engine waits for takes the kernel's
  launch and completion (``latency``), then its pages' bytes read: GPU pages
  from HBM, host pages across the link toward the GPU (the check kernel reads them through
  their mapped address), both by at most ``ctas`` CTAs, which slow compute as copy-kernel
  CTAs do; disk pages read back from the device.
- ``refcheck.start``: when a check starts reading. ``hold_end`` (the default): when the
  hold ends, beside the held step, as if the loop launched it last; ``launch``: when the
  engine launches it, so that it reads while the loop's hold keeps the compute stream
  idle, and only what is left of it when the hold ends meets the step.
- ``refcheck.holds_sms``: which checks take every SM while they read, so that a step
  running or launched meanwhile makes no progress until the check ends (the hw
  ``kv_check`` is a grid of up to 65535 CTAs on a stream of the highest priority, the
  step's on the lowest: host pages, read through their mapped address at about the SM
  copy kernel's rate, hold the SMs for ~44 us a 2 MiB page on the H200). ``none``
  (the default): a check's CTAs slow compute as copy-kernel CTAs do; ``host``: checks
  of host pages hold them; ``all``: GPU pages' checks too.
- ``step.gap``: the loop's host time between a step's end and the next step's launch,
  before every step (on hw the compute stream sits idle meanwhile: the compute log's GPU
  gap); a held step's hold (``resume``, fitted beyond the run's median lag) comes on top.
- ``step.overrun_rate`` / ``step.overrun_after``: a step's GPU time (its two events on hw)
  is longer by ``overrun_rate`` x its read seconds beyond ``overrun_after`` (the nominal
  seconds not in GEMMs), as time the SMs are not held (``HwLoopSim``: a tail after the
  step's work). Fitted by ``kvsim.tools.fitgap``; what it is and is not: its module.

The shipped ``configs/hwloop/h200.yaml`` holds the terms fitted to and measured on the H200
machine's replays (its comments say how); ``none`` is the model that charges nothing.
``kvsim compare --calibrate`` measures the ``step`` terms on the machine it runs on
(``kvsim.tools.loopprobe``): they differ between machines more than any other term here;
and scales the host costs at a resume (``resume``, ``resume_per_page``,
``refcheck.launch_per_page``) to the probe's resumes' host lag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvsim.config.hardware import Seconds, load_yaml_model

DEFAULT = "h200"  # configs/hwloop/h200.yaml: what kvsim compare uses unless told otherwise


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RefcheckCost(_Spec):
    """What the hw backend's refcheck of a batch costs the loop and the GPU."""

    latency: Seconds = 0.0
    ctas: int = Field(132, gt=0)
    launch_per_page: Seconds = 0.0
    start: Literal["hold_end", "launch"] = "hold_end"
    holds_sms: Literal["none", "host", "all"] = "none"


class StepCost(_Spec):
    """What every engine step costs the hw loop beyond the step's nominal time."""

    gap: Seconds = 0.0
    overrun_rate: Annotated[float, Field(ge=0)] = 0.0
    overrun_after: Seconds = 0.0

    def overrun_s(self, read_s: float) -> float:
        """How much longer than nominal a step with ``read_s`` of reads runs."""
        return self.overrun_rate * max(0.0, read_s - self.overrun_after)


class HwLoopModel(_Spec):
    """The hw backend's own host costs in a replay (the module docstring)."""

    name: str = "none"
    resume: Seconds = 0.0
    resume_per_page: Seconds = 0.0
    transfer: Seconds = 0.0
    disk: Seconds = 0.0
    refcheck: RefcheckCost = RefcheckCost()
    step: StepCost = StepCost()
    notes: str = ""

    def resume_s(self, pages: int) -> float:
        """How late the next engine step starts after resuming a request of ``pages``
        GPU pages."""
        return self.resume + pages * self.resume_per_page


def load_hw_loop(path_or_name: str | Path) -> HwLoopModel:
    """A hw-loop model from a YAML path or a preset name under configs/hwloop/ (``none``:
    the model that charges nothing). Raises ``ProfileError`` naming the file and key."""
    if str(path_or_name) == "none":
        return HwLoopModel()
    return load_yaml_model(HwLoopModel, path_or_name, "hwloop")


class HwLoop:
    """One replay's account of the loop's host time: what the resumes and check launches
    since the last compute owe (``owed_s``); the next compute starts that much later."""

    def __init__(self, model: HwLoopModel):
        self.model = model
        self.owed_s = 0.0

    def resumed(self, pages: int) -> None:
        """The engine resumed a request of ``pages`` GPU pages (none: a cold prompt, no
        match to walk and nothing to check: no cost)."""
        if pages > 0:
            self.owed_s += self.model.resume_s(pages)

    def check_launched(self, pages: int) -> None:
        """The loop launched a check of ``pages`` GPU pages."""
        self.owed_s += pages * self.model.refcheck.launch_per_page

    def take(self) -> float:
        """What is owed, now spent (0 after)."""
        owed, self.owed_s = self.owed_s, 0.0
        return owed
