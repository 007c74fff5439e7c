"""Scratch (gemmclock3): the grid's mix cells by length, each GEMM chain's GPU time and the SM clock (clock64 over globaltimer, one
spinning thread on its own stream) while a step runs alone and beside copies."""
import json, sys, time, os
sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "backends")]
import cupy as cp
from kvsim.config.hardware import load_profile
from kvsim.run.seam import settings_for
from kvsim.tools.fitkinds import kind_works
from kvsim_backends.hw import standin as SI
from kvsim_backends.hw.interfere import Cell, measure_cells, KiB, MiB, GiB

CLK = cp.RawKernel(r'''
extern "C" __global__ void clk(unsigned long long* out, int n, unsigned long long period) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int i = 0; i < n; i++) {
    unsigned long long target = t0 + (unsigned long long)(i + 1) * period;
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t < target);
    long long c = clock64();
    out[2 * i] = t; out[2 * i + 1] = (unsigned long long)c;
  }
}''', "clk")
PERIOD_NS = 200_000
log = []
clk_stream = cp.cuda.Stream(non_blocking=True)
orig = SI.StandIn.launch

def launch(self, stream, seconds, work):
    g, gemms, read_s = SI.plan(seconds, work, self.model, self.chain_s)
    n = int((seconds + 0.03) * 1e9 / PERIOD_NS)
    buf = cp.zeros(2 * n, dtype=cp.uint64)
    evs = []
    with stream:
        e = cp.cuda.Event(); e.record(stream); evs.append(e)
        for m, k in gemms:
            for _ in range(k):
                for (kk, n), b in zip(self.model.projections, self._b):
                    if self._gemm is not None:
                        self._gemm(self._a[kk], b, self._c[n], m, kk, n)
                    else:
                        cp.matmul(self._a[kk][:m], b, out=self._c[n][:m])
                    e = cp.cuda.Event(); e.record(stream); evs.append(e)
    ctas = int(read_s * self.read_Bps / SI.READ_CTA_BYTES) if read_s > 0 else 0
    if ctas:
        self._reads(stream, ctas)
    e = cp.cuda.Event(); e.record(stream); evs.append(e)
    log.append({"evs": evs, "buf": buf, "stream": stream})
    return {"gemm_share": g, "gemms": gemms, "read_s": read_s, "read_ctas": ctas}

SI.StandIn.launch = launch

def drain(tag):
    out = []
    for r in log:
        r["evs"][-1].synchronize(); clk_stream.synchronize()
        e0 = r["evs"][0]
        ts = [cp.cuda.get_elapsed_time(e0, e) / 1e3 for e in r["evs"]]
        b = cp.asnumpy(r["buf"]).astype("int64").reshape(-1, 2)
        out.append({"ev_s": ts, "clk": b.tolist()})
    log.clear()
    return out

prof = load_profile("h200-pcie-calibrated")
M = "mix"
cells = [Cell(M, 0.005, "sm_kernel", "both", 16 * KiB, 256 * MiB),
         Cell(M, 0.010, "sm_kernel", "both", 16 * KiB, 256 * MiB),
         Cell(M, 0.020, "sm_kernel", "both", 16 * KiB, 256 * MiB),
         Cell(M, 0.050, "sm_kernel", "both", 16 * KiB, 256 * MiB),
         Cell(M, 0.050, "sm_kernel", "both", 16 * KiB, 512 * MiB),
         Cell(M, 0.020, "sm_kernel", "h2d", 16 * KiB, 256 * MiB),
         Cell(M, 0.020, "sm_kernel", "d2h", 16 * KiB, 256 * MiB),
         Cell(M, 0.020, "copy_engine", "both", 16 * KiB, 256 * MiB),
         Cell("gemm", 0.020, "sm_kernel", "both", 16 * KiB, 256 * MiB),
         Cell("memory", 0.020, "sm_kernel", "both", 16 * KiB, 256 * MiB)]
res = []
for c in cells:
    t0 = time.perf_counter()
    rows = measure_cells(lambda pb, slots, **kw: settings_for(pb, slots, prof, model="llama-3-8b", **kw),
                         [c], kind_works(prof), "gpu", reps=4, gap_s=0.1,
                         progress=lambda s: print("#", s, flush=True))
    reps = drain(c.name)
    # measure_cells: warm rep 0 (alone, with), then reps alone/with alternating; skip calibration launches
    res.append({"cell": c.name, "row": {k: v for k, v in rows[0].items() if k not in ("projections",)},
                "reps": reps[-10:]})
    print(f"# {c.name} {time.perf_counter() - t0:.1f} s, {len(reps)} launches", flush=True)
json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "period_ns": PERIOD_NS, "cells": res},
          open(sys.argv[1], "w"))
