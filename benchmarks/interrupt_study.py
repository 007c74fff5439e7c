"""Ctrl-C at random moments into ``kvsim study``: how the command ends each time.

A terminal's Ctrl-C reaches the whole process group (the command, Dask's fork server,
its workers). Each round starts a small study (``--points`` seeds of a synthetic
workload, one local worker, points of about 0.2 s each) in a process group of its own,
sends SIGINT to the group after a random delay in ``--delay LO,HI`` seconds (its start,
the cluster's start, the points, the table and plots), and sorts how it ended:

- ``interrupted``: exit 130, the one ``interrupted (SIGINT)`` line (none where Python
  was still starting, before kvsim's code ran), no traceback, and no process of its
  group left 10 s after;
- ``finished``: exit 0 with the study complete, the signal come after its last point
  was written (at the very end, Python's own exit may end on it: exit -2, no output
  lost);
- anything else is ``bad`` (a hang past ``--wait`` seconds, a traceback, a signal the
  command lost mid-work, another exit code), and its stderr is kept under ``--keep``.

Run it beside a load (``--load N`` busy processes) to move the moments around. Last line:
``interrupt_study_clean: K of N`` (interrupted or finished).

    python3 benchmarks/interrupt_study.py [--rounds 40] [--delay 0.3,3.5] [--load 0] [--seed 0]
        [--wait 40] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STUDY = """\
name: interrupt
base: default
set:
  workload.synthetic.n_sessions: 12
  output.plots: false
seeds: [{seeds}]
"""


def _group_left(pgid: int) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pgid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split()[0] == str(pgid)]


def one_round(exe: list[str], folder: Path, delay: float, wait: float, points: int) -> tuple[str, str]:
    """(outcome, detail) of one study sent SIGINT after ``delay`` seconds."""
    (folder / "s.yaml").write_text(STUDY.format(seeds=", ".join(str(i) for i in range(points))))
    proc = subprocess.Popen([*exe, "study", str(folder / "s.yaml"), "--out", str(folder / "out"),
                             "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    time.sleep(delay)
    sent = time.time()
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        _, err = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return "bad", f"still running {wait:g} s after the signal\n{err}"
    deadline = time.monotonic() + 10
    while _group_left(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _group_left(proc.pid)
    if left:
        return "bad", "processes left: " + "; ".join(left) + "\n" + err
    if "Traceback" in err:
        return "bad", err
    written = [f.stat().st_mtime for f in (folder / "out" / "points").glob("*/point.json")]
    done = len(written)
    if proc.returncode == 130 and ("interrupted (SIGINT)" in err or not err.strip()):
        return "interrupted", f"{done} of {points} points kept" + ("" if err.strip() else
                                                                 " (Python still starting: no line)")
    if proc.returncode in (0, -signal.SIGINT) and done == points and (folder / "out" / "study.csv").is_file():
        if max(written) > sent + 0.05:   # (points written after the signal: it was lost)
            return "bad", f"exit {proc.returncode}: points written {max(written) - sent:.2f} s after the signal"
        return "finished", f"exit {proc.returncode}"
    return "bad", f"exit {proc.returncode}, {done} of {points} points\n{err}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--delay", default="0.3,3.5", help="LO,HI: seconds from the start to the signal")
    ap.add_argument("--points", type=int, default=6)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the study")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait", type=float, default=40.0, help="seconds an interrupted study may take")
    ap.add_argument("--keep", default=None, help="write each bad round's stderr here")
    a = ap.parse_args(argv)
    try:
        lo, hi = (float(x) for x in a.delay.split(","))
        if not 0 <= lo <= hi:
            raise ValueError
    except ValueError:
        ap.error(f"--delay {a.delay}: expected LO,HI seconds, 0 <= LO <= HI")
    if a.rounds < 1 or a.points < 1 or a.load < 0:
        ap.error("--rounds and --points: at least 1; --load: at least 0")
    kvsim = shutil.which("kvsim")
    exe = [kvsim] if kvsim else [sys.executable, "-m", "kvsim"]
    rng = random.Random(a.seed)
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.load)]
    counts = {"interrupted": 0, "finished": 0, "bad": 0}
    try:
        for i in range(a.rounds):
            delay = rng.uniform(lo, hi)
            with tempfile.TemporaryDirectory(prefix="kvsim-interrupt-") as tmp:
                outcome, detail = one_round(exe, Path(tmp), delay, a.wait, a.points)
            counts[outcome] += 1
            print(f"round {i}: signal at {delay:.2f} s: {outcome}: {detail.splitlines()[0] if detail else ''}",
                  flush=True)
            if outcome == "bad" and a.keep:
                Path(a.keep).mkdir(parents=True, exist_ok=True)
                (Path(a.keep) / f"round-{i}.txt").write_text(detail)
    finally:
        for p in load:
            p.kill()
            p.wait()
    print(f"interrupted {counts['interrupted']}, finished {counts['finished']}, bad {counts['bad']}")
    print(f"interrupt_study_clean: {counts['interrupted'] + counts['finished']} of {a.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
