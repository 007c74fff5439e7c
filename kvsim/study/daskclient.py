"""The Dask cluster a study or a tune runs on, from its start to its end.

``open_client`` connects to a cluster by address, or starts a ``LocalCluster`` of
single-threaded worker processes forked from a fork server that has imported kvsim; its
workers are warmed (kvsim.study.execute.warm) before the first point is sent. It closes
as Dask does at a normal end; on a signal or an error within seconds, stopping the
worker processes it started itself (``_close``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator

from kvsim.study.execute import quiet_interrupts, warm


#: what a worker imports to replay a point; the fork server imports them once
WORKER_MODULES = ("kvsim.study.forkserver_quiet", "distributed", "kvsim.config", "kvsim.run", "kvsim.study.cache",
                  "kvsim.study.execute", "kvsim.workload")


def _preload_fork_server(settings: dict) -> None:
    """Have the fork server (Dask's ``forkserver`` multiprocessing context, a singleton of
    this process) import WORKER_MODULES when it starts. Dask sets its own preload list
    once, on its first ``get_mp_context`` call; this call comes after it, so the list
    stays kvsim's. Where the fork server already runs (a second study in one process),
    it keeps what it imported. It starts with SIGINT ignored where that costs the command
    nothing (``spawn_ignoring_sigint``), and the first module it imports has it ignore
    SIGINT from then on in any case (kvsim.study.forkserver_quiet)."""
    import dask
    from distributed.utils import get_mp_context

    with dask.config.set(settings):
        ctx = get_mp_context()
    ctx.set_forkserver_preload(list(WORKER_MODULES))
    from multiprocessing import forkserver

    # it imports them while this process starts the scheduler
    spawn_ignoring_sigint(forkserver.ensure_running)


def spawn_ignoring_sigint(start: Callable[[], object]) -> None:
    """Call ``start``, which spawns processes, so that they begin with SIGINT blocked (a
    mask fork and exec keep; Python starts in a few tens of milliseconds, and a Ctrl-C
    then would end the process with a traceback; kvsim.study.forkserver_quiet, the fork
    server's first import, then ignores SIGINT and unblocks it). A Ctrl-C to the command
    meanwhile is neither lost nor acted on inside ``start``: this thread blocks SIGINT and
    its handler only notes it (another thread, such as a BLAS library's, may be the one
    the signal reaches: it must find a handler, for an ignored signal is dropped), and
    the command's own handler gets it after. From another thread than the main one
    (where no handler can be set) ``start`` runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        start()
        return
    noted: list[tuple[int, object]] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        old = signal.signal(signal.SIGINT, lambda signum, frame: noted.append((signum, frame)))
        try:
            start()
        finally:
            signal.signal(signal.SIGINT, old)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if noted:  # what the command's handler would have done then, now
        if callable(old):
            old(*noted[0])
        elif old == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


def check_scheduler(address: str) -> None:
    """A Dask scheduler address kvsim can connect to, checked before any work:
    ``[tcp|tls|ws|wss|ucx]://HOST:PORT`` (no scheme: tcp), the port in 1..65535.
    ValueError naming the address (whether it answers is known only on connecting)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    why = None
    try:
        scheme, loc = parse_address(address, strict=False)
        if scheme not in SCHEMES:
            why = f"unknown scheme {scheme!r} (expected one of {', '.join(SCHEMES)})"
        else:
            host, port = parse_host_port(loc)
            if not host:
                why = "no host"
            elif not 0 < int(port) < 65536:
                why = f"port {port} is not in 1..65535"
    except (ValueError, TypeError) as e:
        why = str(e)
    if why:
        raise ValueError(f"--scheduler {address}: {why}; expected tcp://HOST:PORT")


#: how long an interrupted or failed command waits for Dask to close before it stops the
#: worker processes it started itself
QUICK_CLOSE_S = 5.0


def _connect(workers: int | None, scheduler: str | None):
    """(client, the LocalCluster or None): the client on ``scheduler``, or on a new
    LocalCluster of ``workers`` single-threaded processes (default: the cores)."""
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout="30s"), None
        except (OSError, TimeoutError) as e:
            raise ConnectionError(f"--scheduler {scheduler}: cannot connect ({e})") from None
    import dask

    n = workers or os.cpu_count() or 1
    settings = {}
    if sys.platform == "linux" and not os.environ.get("DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD"):
        # Workers fork from a fork server: one single-threaded process, started once
        # per command, that has imported Dask and kvsim (WORKER_MODULES), so a worker
        # starts in a fraction of a second instead of importing them in a spawned
        # interpreter. Not from this process: it runs Dask's threads, and a fork can
        # copy a lock that one of them held at that instant (a log stream's buffer)
        # into the worker, locked for good: the worker then hangs on its first write.
        settings["distributed.worker.multiprocessing-method"] = "forkserver"
        _preload_fork_server(settings)
    with dask.config.set(settings):
        # everything on the loopback; the scheduler's HTTP server on any free port
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               dashboard_address="127.0.0.1:0", memory_limit=0,
                               silence_logs=logging.ERROR, host="127.0.0.1")
    try:
        return Client(cluster), cluster
    except BaseException:
        _close(None, cluster, quick=True)
        raise


def _processes(cluster) -> list:
    """The worker processes of a LocalCluster (psutil handles, which refuse to signal a
    pid the system has since given to another process)."""
    import psutil

    out = []
    for nanny in list(getattr(cluster, "workers", {}).values()):
        pid = getattr(getattr(nanny, "process", None), "pid", None)
        if pid:
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                pass
    return out


def _close(client, cluster, quick: bool) -> None:
    """Close the client, then the LocalCluster kvsim started (None: nothing to close).
    ``quick`` (the command was interrupted or failed): each close waits QUICK_CLOSE_S at
    most, whatever it raises is dropped (the first error is the one to report), and
    the cluster's worker processes still alive are killed; Dask's exit hook is told the
    cluster is done with, so it does not wait on it again."""
    import psutil

    from kvsim.scratch import release_import_lock

    if quick:
        release_import_lock()   # (Dask's threads import as they close)
    procs = _processes(cluster) if quick and cluster is not None else []
    for obj in (client, cluster):
        if obj is None:
            continue
        if not quick:
            obj.close()
            continue
        try:
            obj.close(timeout=QUICK_CLOSE_S)
        except Exception:
            pass
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    if quick and cluster is not None:
        cluster.shutdown_on_close = False


class SyncCancelNoise(logging.Filter):
    """Drops one log record: Dask's ``sync`` cancels its call on a Ctrl-C by a callback
    that raises NameError where the call had not started yet, which tornado then logs
    with its traceback on the command's stderr (distributed 2026.8). Nothing is lost:
    the command is on its way out, and says so."""

    def filter(self, record: logging.LogRecord) -> bool:
        e = record.exc_info[1] if record.exc_info else None
        if not isinstance(e, NameError):
            return True
        tb = traceback.extract_tb(e.__traceback__)
        return not (tb and tb[-1].name == "cancel" and tb[-1].filename.endswith(("distributed/utils.py",
                                                                                 "distributed\\utils.py")))


@contextmanager
def open_client(workers: int | None = None, scheduler: str | None = None) -> Iterator:
    """A dask.distributed Client: on ``scheduler`` (tcp://HOST:PORT), or on a LocalCluster
    of ``workers`` single-threaded processes (default: the cores). Workers are warmed.
    A signal while the cluster is built waits for it (a half-built one cannot be
    closed); on a signal or an error afterwards the cluster closes within seconds."""
    from kvsim.scratch import signals_deferred
    from kvsim.study.cache import WorkloadCache

    client = cluster = None
    quick = True
    noise = SyncCancelNoise()
    logging.getLogger("tornado.application").addFilter(noise)
    try:
        with signals_deferred():
            client, cluster = _connect(workers, scheduler)
        if cluster is not None:
            client.run(quiet_interrupts)
        client.run(warm)   # a worker's first replay (imports done where forked)
        client.register_plugin(WorkloadCache())   # a fresh one: replaces a last study's
        yield client
        quick = False
    finally:
        try:
            _close(client, cluster, quick)
        finally:
            logging.getLogger("tornado.application").removeFilter(noise)
