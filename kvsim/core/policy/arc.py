"""ARC: Nimrod Megiddo, Dharmendra S. Modha, "ARC: A Self-Tuning, Low Overhead
Replacement Cache", FAST 2003 (https://www.usenix.org/conference/fast-03/arc-self-tuning-low-overhead-replacement-cache),
as libCacheSim implements it (``ARC.c``: ``p`` a float, as in the reference
implementation it was checked against), and as vLLM's offloading manager keeps it
(``vllm/v1/kv_offload/arc_manager.py``: pages in use are passed over).

Per tier of c pages: T1 (pages seen once since they joined) and T2 (seen again), each an
LRU list; ghosts B1 and B2, the keys of pages evicted from T1 and T2; a target ``p`` for
T1's size, from 0, within 0..c (a tier that shrinks below ``p`` caps it at its new c).

- A hit moves a page to T2's most recent end.
- A key found in B1 (a ghost hit) raises ``p`` by ``max(|B2| / |B1|, 1)`` (at most c),
  one found in B2 lowers it by ``max(|B1| / |B2|, 1)`` (at least 0); the key leaves its
  ghost, and the page joins T2. Any other page joins T1.
- REPLACE evicts T1's least recent page into B1 if T1 is not empty and holds more than
  ``p`` pages (or exactly ``p`` and the page coming in was a B2 ghost hit), or T2 is
  empty; else T2's into B2.
- An eviction for a page that was a ghost hit is REPLACE. For any other (the paper's case
  IV): if T1 and B1 hold c pages or more, B1's oldest key is dropped and REPLACE, or, B1
  being empty, T1's least recent page is evicted with no ghost; else, when the four lists
  hold 2c, B2's oldest key is dropped, and REPLACE.

The GPU tier learns the keys a prompt will bring in (``incoming``) when the prompt is
declared: a ghost hit adapts ``p`` then, and the evictions that make room for that
prompt's pages are paired with its keys in order (REPLACE for a ghost hit, case IV
otherwise), as libCacheSim evicts for a request after looking it up. With one request at
a time that is the paper's order exactly; with requests interleaved, an eviction is
paired with the oldest announced page not yet evicted for (announced pages whose turn
never ran are forgotten once the tier's capacity of newer ones is announced). A colder
tier, whose arrivals are other tiers' victims, looks a key up when its page arrives, after
the eviction that made room (case IV). A walk is a dry run on counters and cursors;
``evicted`` runs it again up to the last victim and applies it. A page the manager passes
over is in use (locked, held in the last tier, or the parent of cached pages): it goes to
its list's most recent end. A victim whose move fails (its plan rolls back) stays: back in
its list, its ghost forgotten, ``p`` unchanged (no request asked for it: no ghost hit).
Priorities are ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Iterator

from kvsim.core.policy.base import EvictionPolicy
from kvsim.core.policy.queues import TierQueue, WalkRun

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.tiers import Tier

_T1, _T2, _T1_NO_GHOST, _TRIM_B1, _TRIM_B2 = range(5)


class _Run(WalkRun):
    """A walk's overlay: its steps in order (an eviction from T1 or T2, with or without a
    ghost, a ghost trimmed) and how many announced pages its evictions were for."""

    __slots__ = ("steps", "paired")

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, "Page | None"]] = []
        self.paired = 0


class ARCQueue(TierQueue):
    """One tier's ARC state (see the module docstring)."""

    wants_incoming = True

    def __init__(self, tier: "Tier") -> None:
        super().__init__(tier)
        self.t1: OrderedDict["Page", None] = OrderedDict()  # least recent first
        self.t2: OrderedDict["Page", None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()  # oldest first
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.p = 0.0
        # pages announced (``incoming``) and not yet evicted for: key -> 0 (no ghost),
        # 1 (a B1 hit) or 2 (a B2 hit); and the ghost hits not yet inserted (to T2)
        self.owed: OrderedDict[bytes, int] = OrderedDict()
        self.to_t2: OrderedDict[bytes, None] = OrderedDict()

    def __contains__(self, page: object) -> bool:
        return page in self.t1 or page in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def _ghost_hit(self, key: bytes) -> int:
        """Adapt ``p`` to a ghost hit of ``key`` and take it out of its ghost: 1 (B1), 2
        (B2), or 0 (no ghost hit)."""
        b1, b2 = self.b1, self.b2
        c = self.tier.capacity
        if key in b1:
            self.p = min(self.p + max(len(b2) / len(b1), 1), c)
            del b1[key]
            return 1
        if key in b2:  # (p from at most c: the tier may have shrunk since p was set)
            self.p = max(min(self.p, c) - max(len(b1) / len(b2), 1), 0)
            del b2[key]
            return 2
        return 0

    def incoming(self, keys: list[bytes]) -> None:
        self.version += 1
        owed, to_t2 = self.owed, self.to_t2
        for k in keys:
            if not k:
                continue
            kind = self._ghost_hit(k)
            owed.pop(k, None)
            owed[k] = kind
            if kind:
                to_t2[k] = None
        cap = max(1, self.tier.capacity)
        while len(owed) > cap:
            owed.popitem(last=False)
        while len(to_t2) > cap:
            to_t2.popitem(last=False)

    def insert(self, page: "Page") -> None:
        self.version += 1
        key = page.key
        self.owed.pop(key, None)
        if key in self.to_t2:
            del self.to_t2[key]
            self.t2[page] = None
        elif key and self._ghost_hit(key):  # (a colder tier: looked up as it arrives)
            self.t2[page] = None
        else:
            self.t1[page] = None

    def admit(self, pages: list["Page"]) -> None:
        self.version += 1
        t1, t2, b1, b2, owed, to_t2 = self.t1, self.t2, self.b1, self.b2, self.owed, self.to_t2
        for page in pages:
            if page in t1 or page in t2:
                continue
            key = page.key
            if owed:
                owed.pop(key, None)
            if key in to_t2:
                del to_t2[key]
                t2[page] = None
            elif key and (key in b1 or key in b2) and self._ghost_hit(key):
                t2[page] = None
            else:
                t1[page] = None

    def hit(self, page: "Page") -> None:
        self.version += 1
        if page in self.t1:
            del self.t1[page]
            self.t2[page] = None
        else:
            self.t2.move_to_end(page)

    def remove(self, page: "Page") -> None:
        self.version += 1
        if self.t1.pop(page, 0) == 0:
            del self.t2[page]

    def returned(self, pages: list["Page"]) -> None:
        """Victims whose move failed stay: back in the list they left (T2 if their key
        went to B2, else T1), their ghost forgotten, ``p`` unchanged: no ghost hit."""
        self.version += 1
        for page in pages:
            key = page.key
            if key in self.b2:
                del self.b2[key]
                self.t2[page] = None
            else:
                self.b1.pop(key, None)
                self.t1[page] = None

    def new_run(self) -> _Run:
        return _Run()

    def _walk(self, run: _Run) -> Iterator["Page"]:
        c = self.tier.capacity
        seen = run.seen
        p = min(self.p, c)  # (T1's target is at most the tier, which may have shrunk)
        n1, n2, g1, g2 = len(self.t1), len(self.t2), len(self.b1), len(self.b2)
        it1, it2 = iter(self.t1), iter(self.t2)
        kinds = iter(self.owed.values())
        steps = run.steps
        while n1 + n2:
            kind = next(kinds, 0)
            run.paired += 1
            if not kind:  # case IV
                if n1 + g1 + 1 > c:
                    if g1 > 0:
                        g1 -= 1
                        steps.append((_TRIM_B1, None))
                    else:  # T1 alone holds c pages: out with no ghost
                        page = next(it1)
                        n1 -= 1
                        steps.append((_T1_NO_GHOST, page))
                        seen.add(page)
                        run.last = page
                        yield page
                        continue
                elif n1 + g1 + n2 + g2 >= 2 * c and g2 > 0:
                    g2 -= 1
                    steps.append((_TRIM_B2, None))
            # REPLACE
            if (n1 > 0 and (n1 > p or (n1 == p and kind == 2))) or n2 == 0:
                page = next(it1)
                n1 -= 1
                g1 += 1
                steps.append((_T1, page))
            else:
                page = next(it2)
                n2 -= 1
                g2 += 1
                steps.append((_T2, page))
            seen.add(page)
            run.last = page
            yield page

    def _apply(self, run: _Run, gone: set["Page"], stray: set["Page"]) -> None:
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        for op, page in run.steps:
            if op == _TRIM_B1:
                if b1:
                    b1.popitem(last=False)
            elif op == _TRIM_B2:
                if b2:
                    b2.popitem(last=False)
            elif page is None:
                continue
            elif page in gone:
                (t2 if op == _T2 else t1).pop(page)
                if op != _T1_NO_GHOST and page.key:
                    (b2 if op == _T2 else b1)[page.key] = None
            else:  # passed over, in use: back at its list's most recent end
                (t2 if op == _T2 else t1).move_to_end(page)
        owed = self.owed
        for _ in range(min(run.paired, len(owed))):
            owed.popitem(last=False)
        for p in stray:
            if p in self:
                self.remove(p)


class ARC(EvictionPolicy):
    """ARC (see the module docstring)."""

    name = "arc"
    honours_priority = False
    KNOBS: dict[str, str] = {}

    def key(self, page: "Page", clock: int) -> int:  # (a queue policy: never asked)
        raise NotImplementedError("arc orders its tiers by queues, not keys")

    def tier_queue(self, tier: "Tier") -> ARCQueue:
        return ARCQueue(tier)
