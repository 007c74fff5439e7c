"""Copy-engine small pages: how each timed batch moves, rep by rep, across fresh backends
and processes (is the run-to-run spread a warm-up trend, a per-backend effect, or noise?)."""
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import hw_copy as H
from backends.hw import HwBackend, RealtimeRuntime
from kvsim.core.copypath import CopyPath
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
CE, SM = CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL
tag = sys.argv[1]
sizes = [int(s) << 10 for s in sys.argv[2].split(",")]
nback, reps = int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(int(sys.argv[5]) if len(sys.argv) > 5 else 0)
out = []
for pb in sizes:
    for k in range(nback):
        n = max(512, (1 << 30) // pb)
        rt = RealtimeRuntime(poll_interval_s=5e-6)
        be = HwBackend(rt, pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device="gpu", refcheck=False)
        try:
            host = rng.permutation(2 * n); gpu = rng.permutation(2 * n)
            mk = lambda s, d, ss, ds: Batch(BatchKind.EVICT, s, d, ss, ds, np.zeros(n, np.uint64), pb, 0)
            h2d = mk(Level.HOST, Level.GPU, host[:n], gpu[:n]); d2h = mk(Level.GPU, Level.HOST, gpu[n:], host[n:])
            for path in (CE, SM):
                for d, bs in (("h2d", [h2d]), ("d2h", [d2h]), ("both", [h2d, d2h])):
                    ts, calls = [], []
                    for r in range(reps):
                        t0 = time.perf_counter()
                        H.run_wait(rt, [be.transfer(b, path=path) for b in bs])
                        ts.append(time.perf_counter() - t0)
                        calls.append(be.copier.last_call_s if path is CE and hasattr(be, "copier") else None)
                    g = [n * pb * len(bs) / t / 1e9 for t in ts]
                    out.append({"tag": tag, "page": pb, "backend": k, "path": path.value, "dir": d, "GBps": g, "call_s": calls})
                    print(f"{tag} {pb>>10:5d}K b{k} {path.value:11s} {d:4s} " + " ".join(f"{x:5.1f}" for x in g), flush=True)
        finally:
            be.close()
os.makedirs(os.environ["OUT"], exist_ok=True)
json.dump(out, open(os.path.join(os.environ["OUT"], f"cewarm-{tag}.json"), "w"))
