"""S3-FIFO: Juncheng Yang, Yazhuo Zhang, Ziyue Qiu, Yao Yue, K. V. Rashmi, "FIFO queues
are all you need for cache eviction", SOSP 2023 (https://doi.org/10.1145/3600006.3613147),
as libCacheSim (the authors' simulator, ``S3FIFO.c``) implements it.

Per tier: a small FIFO queue S (``small_ratio`` of the tier's pages, 10%), a main FIFO
queue M (the rest) and a ghost FIFO G of the keys of pages evicted from S (``ghost_ratio``
of the tier's pages, 90%). Each page counts its hits (``freq``, from 0 when it joins).

- A page joins M if its key is in G (a ghost hit: the key leaves G), else S; except that
  before the tier's first eviction, a page that finds S full joins M (libCacheSim's
  ``S3FIFO.c``: the pages that fill an empty cache are kept a little longer).
- An eviction takes from M when M holds more than its share or S is empty, else from S.
- From S: the oldest page moves to M (``freq`` back to 0) if it was hit at least
  ``move_to_main`` times (2: the paper's ``freq > 1``), and the next one is looked at;
  else it is evicted and its key enters G (the oldest key leaves a full G).
- From M: the oldest page with ``freq`` >= 1 is reinserted at M's head with
  ``min(freq, 3) - 1`` (a 2-bit clock); the first with ``freq`` 0 is evicted.

``incoming`` (the GPU tier) removes a ghost-hit key from G when its prompt is declared,
before the eviction that makes room for it, as libCacheSim removes it at the lookup; a
colder tier, whose arrivals are other tiers' victims, looks its ghost up when a page
arrives. A walk is a dry run of these steps on overlays (cursors into S and M, the pages
that re-enter M, their new counts); ``evicted`` runs the same walk again up to the last
victim and applies it. A page the manager passes over is in use (locked, held in the last
tier, or the parent of cached pages, which the last tier drops after its children): it
goes back to its queue's head, as if inserted again, so that no walk reads it again
before the rest. A victim whose move fails (its plan rolls back) stays: back in S if its
key went to G (G forgets it), else in M, with no hits: no ghost hit, as no request asked
for it. Priorities are ignored (every page gets 0).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Iterator

from kvsim.core.policy.base import EvictionPolicy
from kvsim.core.policy.queues import TierQueue, WalkRun

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.tiers import Tier


class _Run(WalkRun):
    """A walk's overlay: what it has read of S and M, the pages it put at M's head, the
    counts it changed, the pages it yielded (evicted, so far as the walk knows)."""

    __slots__ = ("s_read", "m_read", "extra", "fq", "out_s", "out_m")

    def __init__(self) -> None:
        super().__init__()
        self.s_read = 0  # pages read from S's tail
        self.m_read = 0  # pages read from M's tail (M as it was)
        self.extra: deque["Page"] = deque()  # pages put at M's head, in order
        self.fq: dict["Page", int] = {}  # their hit counts now
        self.out_s: list["Page"] = []  # yielded from S, in order
        self.out_m: list["Page"] = []  # yielded from M, in order


class S3FIFOQueue(TierQueue):
    """One tier's S3-FIFO state (see the module docstring)."""

    wants_incoming = True

    def __init__(self, tier: "Tier", small_ratio: float, ghost_ratio: float,
                 move_to_main: int) -> None:
        super().__init__(tier)
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.move_to_main = move_to_main
        self.small: OrderedDict["Page", None] = OrderedDict()  # oldest first
        self.main: OrderedDict["Page", None] = OrderedDict()
        self.ghost: OrderedDict[bytes, None] = OrderedDict()
        self.freq: dict["Page", int] = {}
        self.to_main: OrderedDict[bytes, None] = OrderedDict()  # ghost hits announced
        self.has_evicted = False

    # -- sizes (the tier's capacity may change: read it live) ---------------------------
    def _small_size(self) -> int:
        return int(self.tier.capacity * self.small_ratio)

    def _ghost_size(self) -> int:
        return int(self.tier.capacity * self.ghost_ratio)

    # -- events ----------------------------------------------------------------------------
    def __contains__(self, page: object) -> bool:
        return page in self.freq

    def __len__(self) -> int:
        return len(self.freq)

    def incoming(self, keys: list[bytes]) -> None:
        self.version += 1
        ghost, to_main = self.ghost, self.to_main
        for k in keys:
            if k in ghost:
                del ghost[k]
                to_main[k] = None
        while len(to_main) > max(1, self.tier.capacity):  # (announced, never inserted)
            to_main.popitem(last=False)

    def insert(self, page: "Page") -> None:
        self.version += 1
        key = page.key
        if key in self.to_main:
            del self.to_main[key]
            self.main[page] = None
        elif key and key in self.ghost:  # (a colder tier: looked up as it arrives)
            del self.ghost[key]
            self.main[page] = None
        elif not self.has_evicted and len(self.small) >= self._small_size():
            self.main[page] = None
        else:
            self.small[page] = None
        self.freq[page] = 0

    def admit(self, pages: list["Page"]) -> None:
        """``insert`` each page not held, in order (as ``insert`` does, inline)."""
        self.version += 1
        freq, small, main, ghost, to_main = self.freq, self.small, self.main, self.ghost, self.to_main
        full_small = self._small_size()
        early = not self.has_evicted
        for page in pages:
            if page in freq:
                continue
            key = page.key
            if to_main and key in to_main:
                del to_main[key]
                main[page] = None
            elif key and key in ghost:
                del ghost[key]
                main[page] = None
            elif early and len(small) >= full_small:
                main[page] = None
            else:
                small[page] = None
            freq[page] = 0

    def hit(self, page: "Page") -> None:
        self.version += 1
        self.freq[page] += 1

    def remove(self, page: "Page") -> None:
        self.version += 1
        del self.freq[page]
        if self.small.pop(page, 0) == 0:
            del self.main[page]

    def returned(self, pages: list["Page"]) -> None:
        """Victims whose move failed stay: no ghost hit. One whose key its eviction put
        in G goes back to S (G forgets it); the others (from M) back to M."""
        self.version += 1
        for page in pages:
            key = page.key
            if key and key in self.ghost:
                del self.ghost[key]
                self.small[page] = None
            else:
                self.main[page] = None
            self.freq[page] = 0

    # -- eviction --------------------------------------------------------------------------
    def new_run(self) -> _Run:
        return _Run()

    def _walk(self, run: _Run) -> Iterator["Page"]:
        small, main, freq = self.small, self.main, self.freq
        seen = run.seen
        main_size = self.tier.capacity - self._small_size()
        threshold = self.move_to_main
        s_left, s_iter = len(small), iter(small)
        m_orig, m_iter = len(main), iter(main)
        m_n = m_orig  # pages in M, as far as the walk knows
        extra, fq = run.extra, run.fq
        while s_left or m_n:
            if m_n > main_size or not s_left:  # from M: a 2-bit clock
                while True:
                    if run.m_read < m_orig:
                        p = next(m_iter)
                        run.m_read += 1
                        f = freq[p]
                    else:
                        p = extra.popleft()
                        f = fq[p]
                    if f >= 1:
                        fq[p] = min(f, 3) - 1
                        extra.append(p)
                        continue
                    m_n -= 1
                    run.out_m.append(p)
                    seen.add(p)
                    run.last = p
                    yield p
                    break
            else:  # from S: to M if hit often enough, else out (to the ghost)
                while s_left:
                    p = next(s_iter)
                    s_left -= 1
                    run.s_read += 1
                    if freq[p] >= threshold:
                        fq[p] = 0
                        extra.append(p)
                        m_n += 1
                        continue
                    run.out_s.append(p)
                    seen.add(p)
                    run.last = p
                    yield p
                    break

    def _apply(self, run: _Run, gone: set["Page"], stray: set["Page"]) -> None:
        small, main, freq = self.small, self.main, self.freq
        for _ in range(run.s_read):
            small.popitem(last=False)
        for _ in range(run.m_read):
            main.popitem(last=False)
        for p in run.extra:
            main[p] = None
        # the pages a walk yielded that were not taken are in use (locked, held, or the
        # parents of cached pages): back at their queue's head, as if inserted again
        for q, out in ((small, run.out_s), (main, run.out_m)):
            for p in out:
                if p not in gone:
                    q[p] = None
        for p, f in run.fq.items():
            if p not in gone:
                freq[p] = f
        ghost, size = self.ghost, self._ghost_size()
        for p in run.out_s:
            if p in gone and size > 0 and p.key:
                ghost[p.key] = None
                while len(ghost) > size:
                    ghost.popitem(last=False)
        for p in gone:
            del freq[p]
        for p in stray:  # (never yielded: not a victim this queue chose)
            if p in self:
                self.remove(p)
        self.has_evicted = True


class S3FIFO(EvictionPolicy):
    """S3-FIFO (see the module docstring): ``small_ratio`` (0.1) of a tier's pages in the
    small queue, a ghost of ``ghost_ratio`` (0.9) of them, pages hit ``move_to_main`` (2)
    times in the small queue move to the main one."""

    name = "s3-fifo"
    honours_priority = False
    #: the knobs ``cache.policy.knobs`` may set: name -> kind ("ratio": in (0, 1);
    #: "count": an integer >= 1)
    KNOBS = {"small_ratio": "ratio", "ghost_ratio": "ratio", "move_to_main": "count"}

    def __init__(self, small_ratio: float = 0.1, ghost_ratio: float = 0.9,
                 move_to_main: int = 2) -> None:
        self.small_ratio = small_ratio
        self.ghost_ratio = ghost_ratio
        self.move_to_main = move_to_main

    def key(self, page: "Page", clock: int) -> int:  # (a queue policy: never asked)
        raise NotImplementedError("s3-fifo orders its tiers by queues, not keys")

    def tier_queue(self, tier: "Tier") -> S3FIFOQueue:
        return S3FIFOQueue(tier, self.small_ratio, self.ghost_ratio, self.move_to_main)

    def check_tier(self, capacity: int) -> str | None:
        if int(capacity * self.small_ratio) >= 1:
            return None
        need = max(1, math.ceil(1 / self.small_ratio) - 1)
        while int(need * self.small_ratio) < 1:  # (the smallest tier whose share is a page)
            need += 1
        return (f"its small queue (small_ratio {self.small_ratio} of {capacity} pages) holds "
                f"no page; S3-FIFO needs at least {need} pages, or a larger small_ratio")
