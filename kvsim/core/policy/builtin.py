"""The built-in eviction policies other than LRU (see base.py for the interface)."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kvsim.core.policy.base import EvictionPolicy

if TYPE_CHECKING:
    from kvsim.core.pages import Page

#: ``Belady``'s next use of a block never used again: later than any turn (an int, as the
#: turns are: heap keys then compare int with int)
NEVER = 1 << 62
_COUNT = (1 << 32) - 1  # NextUses.index: the low bits count a block's uses


#: ``LFU``'s keys: priority, uses and recency in one int (``(priority * 2 ** 48 + uses)
#: * 2 ** 48 + last_use``; uses and the recency counter stay below 2 ** 48)
_FIELD = 48


class LFU(EvictionPolicy):
    """Least frequently used: lowest priority, then fewest uses, then least recently used
    (libCacheSim's ``LFU``: ties go to the page that reached its count first). The key,
    ``(priority, uses, last_use)``, is packed into one int in that order (``int_keys``)."""

    name = "lfu"
    static_keys = True
    int_keys = True

    def key(self, page: "Page", clock: int) -> int:
        return (page.priority << _FIELD | page.uses) << _FIELD | page.last_use


#: ``GDSF``'s keys: the priority above the value, one int (``priority * 2 ** 53 +
#: value``; values below 2 ** 53, exact in the float ``page.score`` keeps them in)
VALUE_BITS = 53


class GDSF(EvictionPolicy):
    """Greedy-Dual-Size-Frequency: Ludmila Cherkasova, "Improving WWW Proxies Performance
    with Greedy-Dual-Size-Frequency Caching Policy", HP Labs HPL-98-69R1, 1998
    (https://www.hpl.hp.com/techreports/98/HPL-98-69R1.html); libCacheSim's ``GDSF``.

    A page's value is ``H = L + frequency x cost / size``, lowest evicted first (within a
    priority; equal values: the one valued first). ``L``, the tier's inflation, rises to
    the value of each page the tier evicts, so pages not used for long age out whatever
    their cost. Frequency: the turns that used the page (``page.uses``). Size: the slots
    it takes, one for every page. Cost (``cost``): the recompute its eviction brings on
    the turn that uses it: its own block and every block after it in that turn's prompt
    (a miss ends the cached prefix), a block at depth d costing d + 1 (it attends to the d
    blocks before it and itself). So a page deep in a long prefix is worth more than a
    leaf of a short one. ``H`` is set when a turn that used the page ends, with the
    inflation of the tier the page is in then, and kept in ``page.score``; each tier ages
    by its own victims. A use never lowers a page's value (a shared prefix used by a
    short prompt keeps what a long one made it worth): so a parent is worth at least each
    of its children (every turn that uses a child uses its parent, at a cost at least the
    child's), children leave first, and the last tier's drop order, children before
    parents, has no parents to step over. Values are integers (costs are), the key one
    int: ``int_keys``."""

    name = "gdsf"
    static_keys = True
    int_keys = True
    rekey_on_use = False  # the value changes as a turn ends, not as it is declared

    def __init__(self) -> None:
        self.inflation: dict[int, int] = {}  # tier position -> L

    def cost(self, pages: list["Page"]) -> list[int]:
        """The cost of each page of a turn (its pages in prompt order): the depth-weighted
        blocks from it to the turn's last, ``sum(j + 1 for j in index .. last)``."""
        last = pages[-1].index + 1
        top = last * (last + 1) // 2
        return [top - p.index * (p.index + 1) // 2 for p in pages]

    def on_turn(self, pages: list["Page"], clock: int) -> None:
        if not pages:
            return
        infl = self.inflation
        size = 1  # every page takes one slot
        for p, c in zip(pages, self.cost(pages)):
            h = infl.get(p.tier, 0) + p.uses * c // size
            if h > p.score:
                if h >> VALUE_BITS:
                    raise OverflowError(f"{self.name}: a page's value passed 2 ** {VALUE_BITS}")
                p.score = h

    def key(self, page: "Page", clock: int) -> int:
        return page.priority << VALUE_BITS | int(page.score)

    def keys(self, pages: list["Page"], clock: int) -> list[int]:
        return [p.priority << VALUE_BITS | int(p.score) for p in pages]

    def on_evict(self, pages: Iterable["Page"], clock: int) -> None:
        infl = self.inflation
        for p in pages:
            h = int(p.score)
            if h > infl.get(p.tier, 0):
                infl[p.tier] = h


class LFUDA(GDSF):
    """LFU with dynamic aging: Martin Arlitt, Ludmila Cherkasova, John Dilley, Rich
    Friedrich, Tai Jin, "Evaluating Content Management Techniques for Web Proxy Caches",
    ACM SIGMETRICS Performance Evaluation Review 27(4), 2000
    (https://doi.org/10.1145/346000.346003). GDSF with every cost and size 1: a page's
    value is ``H = L + uses``, lowest evicted first, ``L`` rising to each victim's value.
    Frequency counts, but a page once popular ages out as ``L`` passes it: LFU without
    its pollution by pages that were hot long ago. (libCacheSim's ``LFUDA`` adds ``L`` to
    a page's count at each hit rather than one, and with ``L`` at 0 a hit adds nothing;
    its ``GDSF`` with one-byte objects is LFU-DA as published, the reference kvsim's
    ``lfu-da`` is checked against.)"""

    name = "lfu-da"

    def cost(self, pages: list["Page"]) -> list[int]:
        return [1] * len(pages)


class NextUses:
    """The future of a trace for ``Belady``, compact: ``turns`` holds the turns (ascending
    ordinals) that use each block, block after block, and ``index[chain key]`` says where
    a block's run of ``turns`` starts and how long it is (``start << 32 | count``). Ints
    and one array, built once per trace: nothing the garbage collector has to walk, and
    a next use is one dict lookup and a bisection within the run. ``get(key)`` reads like
    a mapping of key -> sorted turns (``Belady`` takes either).

    Optionally (``future_uses`` builds it) the same future by occurrence, turn after turn
    in prompt order: ``occ_keys[starts[turn] + i]`` is the chain key of block ``i`` of that
    turn's prompt, ``occ_next[...]`` the next turn that uses that block (``NEVER``: none).
    A block's position in any prompt that holds it is its depth (its key hashes its whole
    prefix), so a page at depth ``i`` whose block a turn ``t`` uses finds its next use
    after ``t`` there, in the arrays a turn's pages read one after another, rather than
    through the dict; ``Belady`` checks the key before it trusts the entry."""

    __slots__ = ("index", "turns", "starts", "occ_keys", "occ_next")

    def __init__(self, index: dict[bytes, int], turns: "array[int]",
                 starts: Sequence[int] | None = None, occ_keys: Sequence[bytes] | None = None,
                 occ_next: Sequence[int] | None = None) -> None:
        self.index = index
        self.turns = turns
        self.starts = starts
        self.occ_keys = occ_keys
        self.occ_next = occ_next

    @classmethod
    def from_lists(cls, uses: Mapping[bytes, Sequence[int]]) -> "NextUses":
        """From key -> ascending turns."""
        index: dict[bytes, int] = {}
        turns = array("q")
        for key, ts in uses.items():
            index[key] = len(turns) << 32 | len(ts)
            turns.extend(ts)
        return cls(index, turns)

    def get(self, key: bytes, default: Any = None) -> Any:
        v = self.index.get(key)
        if v is None:
            return default
        start = v >> 32
        return self.turns[start:start + (v & _COUNT)]

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, key: object) -> bool:
        return key in self.index


class Belady(EvictionPolicy):
    """Belady's MIN (L. A. Belady, "A study of replacement algorithms for a virtual-storage
    computer", IBM Systems Journal 5(2), 1966): evict the page whose next use is furthest
    in the future (never used again: first). It needs the future: ``future[chain key]`` is
    the sorted clock values (turn ordinals, as the manager's clock counts ``prepare``
    calls from 1) at which a turn uses that block (any mapping with ``get``, or a
    ``NextUses``, the compact form a run builds, numbering turns by their nominal
    arrival: the replay's order for independent requests, a guess for closed-loop
    sessions, whose turns wait on the replay). Priorities are ignored. Offline: sim
    only. One request at a time in one tier it is the optimum of kvsim's model (MIN over
    the prefix tree, a running request's pages all resident); with requests running
    together it is not, and not a bound: a page no one needs again can become pinned later
    as the parent of a running request's pages. Nor with a colder tier: each tier orders
    only its own pages, and the last drops its own page used again furthest, which may be
    used sooner than the victims a warmer tier sends it (docs/policies.md, "Belady and
    concurrency")."""

    name = "belady"
    is_bound = True
    floor_key = -NEVER  # never used again: first out, the most common key
    int_keys = True  # (``page.score`` may read back as a float: a compiled Page keeps one)

    def __init__(self, future: "Mapping[bytes, Sequence[int]] | NextUses") -> None:
        self.future = future
        self._index: dict[bytes, int] | None = None
        self._turns: "array[int] | None" = None
        self._occ: tuple[Sequence[int], Sequence[bytes], Sequence[int]] | None = None
        if isinstance(future, NextUses):
            self._index, self._turns = future.index, future.turns
            if future.starts is not None and future.occ_keys is not None \
                    and future.occ_next is not None:
                self._occ = future.starts, future.occ_keys, future.occ_next

    def next_use(self, page: "Page", clock: int) -> int:
        """The first turn after ``clock`` that uses ``page``'s block (``NEVER``: none)."""
        key = page.key
        if not key:
            return NEVER
        index = self._index
        if index is not None:
            v = index.get(key)
            if v is None:
                return NEVER
            lo = v >> 32
            hi = lo + (v & _COUNT)
            turns = self._turns
            i = bisect_right(turns, clock, lo, hi)  # type: ignore[arg-type]
            return turns[i] if i < hi else NEVER  # type: ignore[index]
        uses = self.future.get(key)
        if not uses:
            return NEVER
        i = bisect_right(uses, clock)
        return int(uses[i]) if i < len(uses) else NEVER

    def keys(self, pages: list["Page"], clock: int) -> list[Any]:
        # (``key`` of each, inlined: a turn's pages are keyed at its end)
        index = self._index
        if index is None:
            key = self.key
            return [-int(s) if (s := p.score) > clock else key(p, clock) for p in pages]
        out: list[Any] = []
        self._keys_looked_up(pages, clock, out)
        return out

    def _keys_looked_up(self, pages: list["Page"], clock: int, out: list[Any]) -> None:
        """``keys`` from the future: a page whose next use went by (or that has none yet)
        looks, where the future has occurrence arrays, at its depth in a turn that used
        its block, no later than ``clock``: the one it last expected (``score``), else the
        one its batch's last dict lookup found (a turn's pages end together: mostly the
        same turn), its key checked there; then follows the block's next uses past
        ``clock``. Without such a turn (or arrays), the dict and a bisection. The same
        next uses either way."""
        index, turns = self._index, self._turns
        assert index is not None and turns is not None
        starts, occ_keys, occ_next = self._occ or ((), (), ())
        n_occ = len(occ_keys)
        append = out.append
        near = 0  # a turn, no later than clock, that used the last block looked up
        for p in pages:
            s = p.score
            if s > clock:
                append(-int(s))
                continue
            k = p.key
            if not k:
                append(-NEVER)
                continue
            t = int(s) if s >= 1 else near
            if t and n_occ:
                idx = p.index
                i = starts[t] + idx
                if i < n_occ and occ_keys[i] == k:  # turn t used this block (at its depth)
                    t = occ_next[i]
                    while t <= clock:  # (rarely: uses since then)
                        t = occ_next[starts[t] + idx]
                    p.score = t
                    append(-t)
                    continue
            v = index.get(k)
            if v is None:
                s = NEVER
            else:
                lo = v >> 32
                hi = lo + (v & _COUNT)
                i = bisect_right(turns, clock, lo, hi)  # type: ignore[arg-type]
                s = turns[i] if i < hi else NEVER  # type: ignore[index]
                if i > lo:
                    near = turns[i - 1]  # type: ignore[index]
            p.score = s
            append(-s)

    def key(self, page: "Page", clock: int) -> Any:
        # ``page.score`` keeps the next use found last time: looked up again only once the
        # clock has reached it (one dict lookup and bisection per use, not per comparison)
        s = page.score
        if s <= clock:
            s = self.next_use(page, clock)
            if page.key:  # (a page without its key yet may find its future later)
                page.score = s
            return -s
        return -int(s)
