"""A byte stream of the fluid (``kvsim_backends.sim.fluid``): its bytes left, the
resources it crosses, its own cap (an SM copy kernel's CTAs x their rate), and the rate
the fluid's sharing last gave it.

Invariants: ``remaining`` only falls, brought up to a time by the fluid at the rate it
had since its last change; ``sig`` numbers (``res``, ``cap``, ``ctas``, ``ce``), all its
rate and the load it puts on compute depend on.
"""

from __future__ import annotations

from typing import Callable


class Flow:
    __slots__ = ("remaining", "res", "cap", "sm", "ctas", "ce", "rate", "done", "nbytes", "sig")

    def __init__(self, nbytes: float, res: tuple[str, ...], cap: float, ctas: int, ce: bool,
                 done: Callable[[], object], sig: int):
        self.nbytes = nbytes
        self.remaining = float(nbytes)
        self.res = res
        self.cap = cap          # idle cap in bytes/s (0: none)
        self.sm = ctas > 0
        self.ctas = ctas
        self.ce = ce
        self.rate = 0.0
        self.done = done  # what to call when the bytes have moved
        self.sig = sig  # numbers (res, cap, ctas, ce): all its rate and the slowdown depend on
