"""How fast the SimPy replay runs: the whole Mooncake conversation trace (12,031 requests
over ~59 minutes) on h200-pcie with the Llama 3 70B preset (configs/mooncake-conversation.yaml).

Prints the trace span (first to last arrival, as scaled) divided by the wall time of the
replay, and the simulated time divided by wall time (larger when the simulated GPU falls
behind the trace and the replay runs past its last arrival). With --check (the default)
the same replay also runs step by step (no fast-forward) and every metric but the wall
time and ``balance``'s means over the timeline's samples (taken at step boundaries, which
fast-forwarding moves) must be equal. Last line: ``sim_speed_x: <trace span / wall>``.

    python benchmarks/sim_speed.py [--trace PATH] [--no-check] [--set key=value ...]
                                   [--repeat N] [--installed | --compiled]

``--installed`` replays with the kvsim this interpreter has installed instead of this
checkout's source, e.g. the optional compiled build (``KVSIM_COMPILE=1 pip install .``,
README: "Compiled build (optional)"): ``local/compiled-venv/bin/python
benchmarks/sim_speed.py --installed``. ``--compiled`` does that in one step: it builds the
compiled install in ``local/compiled-venv`` when it is missing or older than this
checkout's sources (``benchmarks/compiled_speed.py``'s build, about two minutes), then runs
this script there with ``--installed``. The ``modules:`` line says which files ran
(``.so``: compiled). ``--repeat N``: N replays, each printed; ``sim_speed_x`` is then their
median (this VM's speed moves by 20-30% within minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from kvsim_choice import choose  # noqa: E402

INSTALLED = choose(__file__)

import kvsim.core.manager  # noqa: E402
from kvsim.config import load_config  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--installed", action="store_true",
                    help="replay with the installed kvsim (e.g. the compiled build), not this checkout")
    ap.add_argument("--compiled", action="store_true",
                    help="build local/compiled-venv if needed and run there with --installed")
    ap.add_argument("--repeat", type=int, default=1, help="replays; sim_speed_x is their median")
    ap.add_argument("--config", default=str(ROOT / "configs" / "mooncake-conversation.yaml"))
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"))
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--no-check", dest="check", action="store_false")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error(f"--repeat: got {a.repeat}; expected >= 1")
    cfg = load_config(a.config, a.sets)
    keep = lambda d: json.dumps({k: v for k, v in d.items() if k != "wall_time_s"}, sort_keys=True)  # noqa: E731
    # balance's means average the timeline's samples, which fall at other step boundaries
    # when steps are fast-forwarded: not compared step by step (docs/commands.md)
    unsampled = lambda d: {**d, "balance": {  # noqa: E731
        t: {k: v for k, v in b.items() if not k.endswith("_mean")} for t, b in d.get("balance", {}).items()}}
    speeds, results = [], set()
    for i in range(a.repeat):
        prep = prepare_run(cfg, a.trace)  # (loading is not timed: the replay's wall is)
        arrivals = [t.arrival_s for _, t in prep.workload.iter_turns()]
        span = max(arrivals) - min(arrivals)
        if i == 0:
            import kvsim_backends.sim.fluid  # noqa: PLC0415 (imported by prepare_run)
            print(f"modules: {kvsim.core.manager.__file__}, {kvsim_backends.sim.fluid.__file__}")
        res = replay(prep)
        m = res.metrics
        wall = m["wall_time_s"]
        if i == 0:
            print(f"requests: {m['requests_completed']} completed, {m['requests_failed']} failed")
            print(f"trace span: {span:.1f} s; simulated: {m['sim_time_s']:.1f} s")
            print(f"engine steps: {m['engine_steps']}; TTFT p50 {m['ttft_s']['p50']:.3f} s; "
                  f"hit ratio {m['hit_ratio']:.4f}")
        speeds.append(span / wall)
        results.add(keep(m))
        print(f"replay {i + 1}: wall {wall:.2f} s, {span / wall:.1f}x real time", flush=True)
    print(f"sim_time_over_wall_x: {m['sim_time_s'] / wall:.1f}")
    if a.repeat > 1:
        print(f"metrics_equal_across_repeats: {len(results) == 1}")
    if a.check:
        step_cfg = load_config(a.config, a.sets + ["engine.fast_forward=false"])
        slow = replay(prepare_run(step_cfg, a.trace)).metrics
        print(f"step-by-step replay: wall {slow['wall_time_s']:.2f} s; "
              f"metrics_equal_step_by_step: {keep(unsampled(slow)) == keep(unsampled(m))}")
    print(f"sim_speed_x: {statistics.median(speeds):.1f}")


if __name__ == "__main__":
    main()
