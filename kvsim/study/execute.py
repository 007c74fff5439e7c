"""Running points on dask.distributed and writing their folders on the client.

A worker gets a point's resolved config (a small dict), builds the run with kvsim's
public run API (``validate_config``, ``prepare_run``, ``replay``), renders the point's
run folder there (``write_files``: summary, CSVs, plots when drawn) and sends the files'
bytes back; it loads the trace itself from the config's path, once for the points that
share it (kvsim.study.cache), so nothing large travels to it. The client writes each
point's files into its folder (staged and swapped into place, as ``write_results``) and
then ``point.json`` (the config hash), last: a folder with a ``point.json`` whose hash
matches is complete, and a study that runs again skips it. A point that fails (a bad
trace path, a replay error, a worker that died) is recorded with its error; the other
points go on.

The cluster (kvsim.study.daskclient) is a ``LocalCluster`` of single-threaded worker
processes, or an existing Dask cluster by address. Workers are warmed once (``warm``:
kvsim and the sim backend imported, a one-turn replay run) before the first point is
sent.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from kvsim.scratch import make_dir, raise_pending, remove
from kvsim.study.points import Point

POINT_FILE = "point.json"


# ---------------------------------------------------------------------------- worker side


WARM_CONFIG = {"name": "warm", "cache": {"tiers": [{"level": "gpu", "quota": "24GiB"}]},
               "workload": {"synthetic": {"n_sessions": 1}, "max_turns": 1},
               "output": {"plots": False}}


def warm() -> str:
    """Load what a point needs, once per worker process: a one-turn replay through the
    public run API (kvsim.run is the one module that imports the backends; about 0.1 s
    once imported). Matplotlib, for points that draw their plots, loads on the first."""
    from kvsim.config import validate_config
    from kvsim.run import prepare_run, replay

    replay(prepare_run(validate_config(WARM_CONFIG, "warm-up")))
    return f"{os.getpid()}"


class HeartbeatNoise(logging.Filter):
    """Drops a LocalCluster worker's "Failed to communicate with scheduler during
    heartbeat" record: the command closes the scheduler first when interrupted, and a
    worker whose heartbeat falls in the next moment logs it with a traceback on the
    command's stderr (distributed 2026.8) before it is killed. Nothing is lost: the
    command says it was interrupted."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to communicate with scheduler during heartbeat")


def quiet_interrupts() -> None:
    """In a LocalCluster's worker: leave Ctrl-C to the command (it shuts the cluster down);
    a terminal's SIGINT reaches the whole process group. The worker's log of the
    scheduler gone (``HeartbeatNoise``) is dropped."""
    import signal

    log = logging.getLogger("distributed.worker")
    if not any(isinstance(f, HeartbeatNoise) for f in log.filters):
        log.addFilter(HeartbeatNoise())
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not this process's main thread
        pass


class SplitError(ValueError):
    """The tune's split cannot be made of the workload: every trial would fail alike."""


def split_workload(workload, part: str, held_out: float, seed: int):
    """The sessions of one part of a seeded split of ``workload`` by session: ``held_out``
    of them (at least one, and at least one left to train on) in 'held_out', the rest
    in 'train'."""
    n = len(workload.sessions)
    if n < 2:
        raise SplitError(f"a held-out split needs at least 2 sessions, the workload has {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    k = min(n - 1, max(1, round(n * held_out)))
    held = set(order[:k])
    keep = [i for i in range(n) if (i in held) == (part == "held_out")]
    return replace(workload, sessions=tuple(workload.sessions[i] for i in keep))


def disk_dirs(configs) -> list[str]:
    """The disk tier folders that resolved configs (dicts) name, each once."""
    out: list[str] = []
    for c in configs:
        for t in (c.get("cache") or {}).get("tiers") or ():
            if isinstance(t, dict) and t.get("level") == "disk" and t.get("path") and t["path"] not in out:
                out.append(t["path"])
    return out


def run_point(config: dict, backend: str = "sim", split: dict | None = None,
              plots: bool | None = None) -> dict:
    """Replay one point (on a worker) and render its run folder's files there. Returns
    {"files" (file name -> bytes: what ``write_results`` writes, plots included when
    drawn), "plots" (the PNGs' names), "metrics", "replay_s", "task_s", "worker",
    "workload_kept"} or {"error"}. The files travel, not the Result: the client only
    writes bytes, so it keeps up with many workers."""
    t0 = time.perf_counter()
    try:
        from kvsim.config import validate_config
        from kvsim.run import prepare_run, replay, write_files
        from kvsim.scratch import sweep_start
        from kvsim.study.cache import worker_cache
        from kvsim.workload import session_start_times

        cfg = validate_config(config, f"point {config.get('name')}")
        sweep_start(*disk_dirs([config]))   # what killed runs left on this worker's host
        cache = worker_cache()
        workload, kept = cache.workload(cfg) if cache is not None else (None, False)
        prep = prepare_run(cfg, workload=workload)
        if split is not None:
            wl = split_workload(prep.workload, split["part"], split["held_out"], split["seed"])
            starts = session_start_times(wl, seed=cfg.seed) \
                if wl.closed_loop and wl.start == "poisson" else None
            prep = replace(prep, workload=wl, starts=starts)
        t1 = time.perf_counter()
        result = replay(prep, backend)
        t2 = time.perf_counter()
        draw = cfg.output.plots if plots is None else plots
        if draw:
            import matplotlib

            matplotlib.use("Agg")
        # rendered in a scratch folder (kvsim.scratch): a worker killed here leaves nothing
        # that the next start's sweep of the temporary folder does not remove
        tmp = make_dir(tempfile.gettempdir(), "kvsim-point")
        try:
            write_files(result, tmp, plots=draw)
            files = {f.name: f.read_bytes() for f in sorted(tmp.iterdir()) if f.is_file()}
        finally:
            remove(tmp)
        return {"files": files, "plots": sorted(n for n in files if n.endswith(".png")),
                "metrics": result.metrics, "replay_s": t2 - t1, "task_s": time.perf_counter() - t0,
                "worker": f"{socket.gethostname()}:{os.getpid()}", "workload_kept": kept}
    except Exception as e:  # recorded for this point; the study goes on
        tb = traceback.extract_tb(e.__traceback__)
        where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
        from kvsim.config import ConfigFileError

        if isinstance(e, ConfigFileError):
            where = ""
        return {"error": f"{type(e).__name__}: {e}{where}", "task_s": time.perf_counter() - t0,
                **({"split_error": str(e)} if isinstance(e, SplitError) else {})}


# ---------------------------------------------------------------------------- client side


def n_workers(client) -> int:
    return max(1, len(client.scheduler_info(n_workers=-1)["workers"]))


def is_complete(folder: Path, hash_: str) -> bool:
    try:
        info = json.loads((folder / POINT_FILE).read_text())
    except (OSError, ValueError):
        return False
    if info.get("hash") != hash_:
        return False
    need = ["summary.json", "requests.csv", *info.get("plots", [])]
    return all((folder / n).is_file() for n in need)


def _write_json(path: Path, data: dict) -> None:
    from kvsim.run.outputs import write_whole

    write_whole(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def write_point(folder: Path, point: Point, payload: dict) -> Path:
    """The point's run folder from the files its worker rendered (staged beside it and
    swapped into place, as ``write_results`` does), then point.json."""
    from kvsim.run.results import Staging

    with Staging.reserve(folder) as stage:
        for name, data in payload["files"].items():
            if Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"a point's file name {name!r}: expected a plain name")
            (stage.path / name).write_bytes(data)
        out = stage.commit()
    _write_json(out / POINT_FILE, {
        "name": point.name, "hash": point.hash, "params": point.params, "variant": point.variant,
        "backend": point.backend, "split": point.split, "plots": payload.get("plots", []),
        "replay_s": payload.get("replay_s"), "task_s": payload.get("task_s"),
        "worker": payload.get("worker"), "workload_kept": payload.get("workload_kept"),
    })
    return out


@dataclass
class Outcome:
    """What running a set of points did: per point name, its error (failed points), its
    timings (``replay_s`` and ``task_s`` in the worker; ``client_s``: fetching the result
    and writing the folder on the client); how many were skipped as already complete; the
    wall time."""
    failures: dict[str, str] = field(default_factory=dict)
    replay_s: dict[str, float] = field(default_factory=dict)
    task_s: dict[str, float] = field(default_factory=dict)
    client_s: dict[str, float] = field(default_factory=dict)
    skipped: int = 0
    ran: int = 0
    wall_s: float = 0.0


Progress = Callable[[int, int, int], None]   # (done, running, failed)


def run_points(client, points: list[Point], folder_of: Callable[[Point], Path],
               progress: Progress | None = None, on_done: Callable | None = None,
               meanwhile: Callable[[], None] | None = None) -> Outcome:
    """Run every point that is not complete in its folder; write each as it comes back.
    ``meanwhile``: called once the points are sent (where any are), while the workers
    replay; the points back by its end are written then."""
    from distributed import as_completed

    t0 = time.perf_counter()
    out = Outcome()
    todo = [p for p in points if not is_complete(folder_of(p), p.hash)]
    out.skipped = len(points) - len(todo)
    futures = {}
    for p in todo:
        fut = client.submit(run_point, p.config, p.backend, p.split, key=f"kvsim-point-{p.hash}-{p.name}"[:250],
                            pure=False)
        futures[fut] = p
    width = n_workers(client)
    done = 0
    if progress:
        progress(out.skipped, min(width, len(todo)), 0)
    if meanwhile is not None and futures:
        meanwhile()
    for fut in as_completed(list(futures)):
        raise_pending()  # (a Ctrl-C Python swallowed in a Dask callback)
        p = futures.pop(fut)
        tc = time.perf_counter()
        try:
            payload = fut.result()
        except Exception as e:  # the worker died or the task could not run
            payload = {"error": f"{type(e).__name__}: {e}"}
        finally:
            fut.release()
        if "error" in payload:
            out.failures[p.name] = payload["error"]
        else:
            try:
                write_point(folder_of(p), p, payload)
                out.replay_s[p.name] = payload["replay_s"]
                out.task_s[p.name] = payload["task_s"]
                out.client_s[p.name] = time.perf_counter() - tc
            except (OSError, ValueError, KeyError) as e:  # KeyError: a worker of another kvsim
                out.failures[p.name] = f"writing {folder_of(p)}: {type(e).__name__}: {e}"
        done += 1
        out.ran += 1
        if on_done is not None:
            on_done(p, payload)
        if progress:
            progress(out.skipped + done, min(width, len(futures)), len(out.failures))
    out.wall_s = time.perf_counter() - t0
    return out


@contextmanager
def progress_bar(total: int, label: str, enabled: bool = True):
    """Points done, running and failed: a rich bar on a terminal's stderr; elsewhere (a
    log, a pipe) a line at most every ``LOG_EVERY_S`` of wall time, as ``kvsim run``.
    Disabled: neither."""
    from kvsim.console import LOG_EVERY_S

    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        t0 = time.monotonic()
        last = [t0]

        def log(done: int, running: int, failed: int) -> None:
            now = time.monotonic()
            if now - last[0] >= LOG_EVERY_S:
                last[0] = now
                print(f"{label}: {done}/{total} points, {running} running, {failed} failed, "
                      f"wall {now - t0:.0f} s", file=sys.stderr, flush=True)

        yield log
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("running {task.fields[running]}, failed {task.fields[failed]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total, running=0, failed=0)
        yield lambda done, running, failed: bar.update(task, completed=done, running=running,
                                                       failed=failed)
