"""Retained disk copies and write-through: the bottom layer of the TierManager's mixins.

A *retained copy* is a disk slot holding the bytes of a page that lives in a warmer tier
(GPU or host). It comes from one of two places:
- keep-copy (``ManagerSpec.keep_copy``): a restore from disk of a fully committed page
  (a full block with its content tag) leaves the disk slot as the page's copy instead of
  freeing it, if the placement policy's ``keep_copy`` agrees (the default keeps every
  one). A partial page never keeps one;
- write-through (``ManagerSpec.write_through``): a fully committed page evicted GPU ->
  host is also written host -> disk by a background plan (``write_through()``, batches
  of kind ``BatchKind.BACKGROUND``); its copy is *ready* once that write succeeded.

An eviction to disk of a page with a ready copy takes the copy back: a ``TAKEBACK``
batch whose destination is the copy's slot; the backends move no bytes for it. Under disk
pressure the disk tier reclaims copies (frees their slots; their pages stay where they
are): first the oldest copies beyond ``protected_copy_fraction`` of the disk's slots,
then disk-only pages (least recently used first, as without copies), then the remaining
copies, oldest first. Held pages never drop, so a held page evicted to disk always wins
over a copy's slot.

Invariants (``kvsim.core.audit`` checks them):
- a page has a copy only while it is live and not on disk; the copy's slot is owned by
  nothing else; a ready copy belongs to a fully committed page and holds its tag;
- ``Tier.copies`` of the disk tier holds exactly the ready copies that are not the
  destination of an in-flight TAKEBACK batch, oldest first; only those are reclaimed;
- a write-through's disk slot is the page's ``copy`` (not ready) until the write ends; a
  page that left, died or was written to disk meanwhile gives its copy up (the write's end
  frees the slot: its bytes are never served); a failed write frees it too;
- the host slot a write-through reads is not reused before the write ends: the page is
  no eviction candidate of the host tier while it is read, and if the page leaves that
  slot (onboarded to GPU, or freed) its release waits for the write's end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from kvsim.core.pages import Page
from kvsim.core.plan import Batch, BatchKind, Plan, PlanKind
from kvsim.core.spec import Level
from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.policy.placement import PlacementPolicy
    from kvsim.core.spec import ManagerSpec
    from kvsim.core.stats import Counters
    from kvsim.core.tiers import Tier


class WriteThrough:
    """A background write in flight: the pages, the host slots it reads, the disk slots it
    writes (internal to the core)."""

    __slots__ = ("pages", "host_slots", "disk_slots")

    def __init__(self, pages: list[Page], host_slots: list[int], disk_slots: list[int]):
        self.pages = pages
        self.host_slots = host_slots
        self.disk_slots = disk_slots


class Copies:
    """Mixin of TierManager (uses its spec, tiers, counters and page size)."""

    # set by TierManager.__init__; declared here for the type checker (and mypyc)
    spec: ManagerSpec
    tiers: list[Tier]
    counters: Counters
    page_bytes: int
    tokens_per_block: int
    _next_plan: int
    placement: PlacementPolicy
    clock: int

    def _init_copies(self) -> None:
        spec = self.spec
        levels = [t.level for t in spec.tiers]
        self._disk_pos = levels.index(Level.DISK) if Level.DISK in levels else -1
        self._host_pos = levels.index(Level.HOST) if Level.HOST in levels else -1
        self.keep_copy = bool(spec.keep_copy) and self._disk_pos >= 0
        self.write_through_on = bool(spec.write_through) and self._disk_pos >= 0 \
            and self._host_pos >= 0
        self.copies_on = self.keep_copy or self.write_through_on
        self.counters.copies_on = self.copies_on
        self._wt_queue: list[Page] = []           # pages evicted GPU -> host, to copy
        self._wt: dict[int, WriteThrough] = {}    # background plans in flight, by plan id
        self._wt_inflight = 0                     # bytes they write
        self._wt_reading: set[int] = set()        # host slots they read
        self._wt_deferred: set[int] = set()       # of those, slots whose page left them
        self._retained = 0                        # disk slots held by copies
        # write_through_take_back (seed 004's rule): a host page under write-through may be
        # evicted to disk onto its pending copy; the write each disk slot belongs to, the
        # pages whose pending copy an in-flight eviction takes back, and of those, the ones
        # whose write failed (the eviction fails and drops the copy)
        self.wt_take_back = self.write_through_on and bool(spec.write_through_take_back)
        self._wt_of_slot: dict[int, int] = {}     # disk slot -> write-through plan id
        self._wt_taken: set[int] = set()          # page ids
        self._wt_lost: set[int] = set()           # page ids

    # == read-only ======================================================================
    def protected_copies(self) -> int:
        """Retained copies the disk may hold ahead of disk-only pages."""
        if self._disk_pos < 0:
            return 0
        return int(self.spec.protected_copy_fraction * self.tiers[self._disk_pos].capacity)

    def retained_slots(self) -> int:
        """Disk slots held by retained copies (ready, being taken back, or being written)."""
        return self._retained

    def _full(self, p: Page) -> bool:
        """A fully committed page: a full block with its content written."""
        return p.tag != 0 and p.ntokens == self.tokens_per_block

    # == keeping, dropping, reclaiming ===================================================
    def _keep_copies(self, pages: list[Page], slots: Sequence[int]) -> list[int]:
        """Pages restored from disk slots ``slots``: keep the full ones' slots as their
        copies. Returns the slots to free."""
        disk = self.tiers[self._disk_pos]
        free = []
        kept = 0
        placement = self.placement
        keep = None if placement.keeps_every_copy else placement.keep_copy
        clock = self.clock
        for p, s in zip(pages, slots):
            if self._full(p) and p.copy < 0 and (keep is None or keep(p, clock)):
                p.copy = s
                p.copy_ready = True
                disk.copies[p] = None
                kept += 1
            else:
                free.append(s)
        self.counters.copies_kept += kept
        self._retained += kept
        return free

    def _drop_copy(self, p: Page) -> None:
        """The page gives its copy up (it died or is on disk now): a ready copy's slot is
        freed; a copy still being written is left to its write, whose end frees the slot."""
        s = p.copy
        if s < 0:
            return
        p.copy = -1
        if p.copy_ready:
            p.copy_ready = False
            disk = self.tiers[self._disk_pos]
            disk.copies.pop(p, None)
            disk.release(s)
            self._retained -= 1
        else:
            self.counters.write_through_dropped += 1

    def _reclaim(self, pages: list[Page]) -> None:
        """Free the copies of ``pages`` (picked by ``_pick_disk``) for room."""
        disk = self.tiers[self._disk_pos]
        for p in pages:
            del disk.copies[p]
            disk.release(p.copy)
            p.copy = -1
            p.copy_ready = False
        self.counters.copies_reclaimed += len(pages)
        self._retained -= len(pages)

    def _pick_leaves(self, tier: Tier, k: int, exclude: set | None, partial: bool = False
                     ) -> list[Page] | None:
        """Droppable leaves of the last tier in the eviction policy's order: implemented by
        ``Eviction``, which owns that order."""
        raise NotImplementedError

    def _pick_disk(self, tier: Tier, k: int, exclude: set | None, taking: set
                   ) -> tuple[list[Page], list[Page]] | None:
        """``k`` slots of the disk tier from its droppable leaves and its retained copies
        (not those of ``taking``, pages that take theirs back in the same plan): the oldest
        copies beyond the protected share first, then leaves in the policy's order, then the
        other copies, oldest first. (victims, copies to reclaim), or None."""
        copies = [p for p in tier.copies if p not in taking] if tier.copies else []
        over = len(tier.copies) - self.protected_copies()
        first = copies[:min(k, over)] if over > 0 else []
        rest = k - len(first)
        victims = (self._pick_leaves(tier, rest, exclude, partial=True) or []) if rest else []
        short = rest - len(victims)
        if short:
            more = copies[len(first):len(first) + short]
            if len(more) < short:
                return None
            first = first + more
        return victims, first

    def _host_reading(self, tier: Tier):
        """A filter of host eviction candidates: those whose slot a write-through reads
        (none with ``write_through_take_back``: such a page takes its pending copy back)."""
        if tier.index_pos == self._host_pos and self._wt_reading and not self.wt_take_back:
            reading = self._wt_reading
            return lambda p: p.slot in reading
        return None

    def _release_src(self, tier: Tier, pages: list[Page]) -> None:
        """Free the slots ``pages`` left in ``tier`` (their move committed); a host slot a
        write-through still reads is freed when that write ends."""
        if self._wt_reading and tier.index_pos == self._host_pos:
            reading = self._wt_reading
            for p in pages:
                if p.slot in reading:
                    self._wt_deferred.add(p.slot)
                else:
                    tier.release(p.slot)
            return
        tier.release_many([p.slot for p in pages])

    # == write-through ===================================================================
    def _queue_write_through(self, pages: list[Page]) -> None:
        if self.write_through_on:
            self._wt_queue.extend(pages)

    def write_through(self) -> Plan | None:
        """The background write of the pages evicted GPU -> host since the last call that
        are still on host without a copy: into free disk slots only (it never evicts), at
        most ``write_through_inflight_bytes`` in flight (the rest waits for the next call),
        never past the protected share of retained copies; pages that find no slot are
        skipped (``write_through_skipped``) and written when evicted, as without it. None
        when there is nothing to write. Complete the plan with ``complete``."""
        q = self._wt_queue
        if not q:
            return None
        host_pos = self._host_pos
        disk = self.tiers[self._disk_pos]
        budget = (self.spec.write_through_inflight_bytes - self._wt_inflight) // self.page_bytes
        room = min(disk.free, self.protected_copies() - self.retained_slots())
        take: list[Page] = []
        seen: set[int] = set()
        skipped = 0
        i = 0
        for i, p in enumerate(q):  # noqa: B007
            if len(take) >= budget:
                break
            if (p.phase is not Phase.RESIDENT or p.tier != host_pos or p.copy >= 0
                    or p.pid in seen or not self._full(p)):
                continue
            seen.add(p.pid)
            if len(take) >= room:
                skipped += 1
                continue
            take.append(p)
        else:
            i = len(q)
        del q[:i]
        self.counters.write_through_skipped += skipped
        if not take:
            return None
        slots = disk.alloc_many(len(take))
        host = [p.slot for p in take]
        for p, s in zip(take, slots):
            p.copy = s
            p.copy_ready = False
        self._wt_reading.update(host)
        self._retained += len(take)
        self._wt_inflight += len(take) * self.page_bytes
        pid = self._next_plan
        self._next_plan += 1
        self.counters.plans += 1
        self._wt[pid] = WriteThrough(take, host, slots)
        if self.wt_take_back:
            for s in slots:
                self._wt_of_slot[s] = pid
        batch = Batch(BatchKind.BACKGROUND, Level.HOST, Level.DISK, host, slots,
                      [p.tag for p in take], self.page_bytes, 0)
        return Plan(pid, PlanKind.WRITE_THROUGH, (batch,))

    def takeback_waits(self, batch: Batch) -> list[int]:
        """The write-through plans a TAKEBACK batch waits for: those still writing the
        pending copies it takes back (seed 004's rule; empty without it)."""
        if not self._wt_of_slot or batch.kind is not BatchKind.TAKEBACK:
            return []
        of = self._wt_of_slot
        return sorted({of[s] for s in batch.dst_slots if s in of})

    def _take_copies(self, pages: list[Page]) -> None:
        """``pages`` go to disk onto their copies: out of the reclaimable index (a pending
        copy is in none); those still being written wait for their write."""
        copies = self.tiers[self._disk_pos].copies
        for p in pages:
            copies.pop(p, None)
            if not p.copy_ready:
                self._wt_taken.add(p.pid)

    def _end_take_back(self, pages: list[Page], ok: bool) -> None:
        """A TAKEBACK batch ended: taken pending copies are settled. Good: the copy was
        written (counted ``copies_reused_pending``). Failed: a copy whose write failed is
        dropped (its slot freed); one whose write still runs is pending again."""
        taken = self._wt_taken
        if not taken:
            return
        disk = self.tiers[self._disk_pos]
        for p in pages:
            if p.pid not in taken:
                continue
            taken.discard(p.pid)
            if ok:
                self.counters.copies_reused_pending += 1
            elif p.pid in self._wt_lost:
                self._wt_lost.discard(p.pid)
                disk.release(p.copy)
                p.copy = -1
                self._retained -= 1

    def _finish_write_through(self, plan: Plan, ok: bool) -> None:
        w = self._wt.pop(plan.pid)
        if self._wt_of_slot:
            for s in w.disk_slots:
                self._wt_of_slot.pop(s, None)
        disk = self.tiers[self._disk_pos]
        host = self.tiers[self._host_pos]
        for h in w.host_slots:
            self._wt_reading.discard(h)
            if h in self._wt_deferred:
                self._wt_deferred.discard(h)
                host.release(h)
        self._wt_inflight -= len(w.pages) * self.page_bytes
        c = self.counters
        for p, d in zip(w.pages, w.disk_slots):
            if p.copy != d:  # the page gave the copy up meanwhile
                disk.release(d)
                self._retained -= 1
            elif p.pid in self._wt_taken:  # an eviction takes it back: it waited for this
                if ok:
                    p.copy_ready = True
                    c.write_through_pages += 1
                else:  # the eviction fails; its end drops the copy
                    self._wt_lost.add(p.pid)
                    c.write_through_failed += 1
            elif ok:
                p.copy_ready = True
                disk.copies[p] = None
                c.write_through_pages += 1
            else:  # never served: the slot is free again
                p.copy = -1
                disk.release(d)
                self._retained -= 1
                c.write_through_failed += 1
        if not ok:
            c.failed_batches += 1


def take_back_split(victims: list[Page], pending: bool = False) -> tuple[list[Page], list[Page]]:
    """Victims going to disk: (those that take their ready copy back, those written); with
    ``pending`` (``write_through_take_back``) a copy still being written is taken back too."""
    if pending:
        take = [v for v in victims if v.copy >= 0]
        if not take:
            return [], victims
        return take, [v for v in victims if v.copy < 0]
    take = [v for v in victims if v.copy >= 0 and v.copy_ready]
    if not take:
        return [], victims
    return take, [v for v in victims if not (v.copy >= 0 and v.copy_ready)]


