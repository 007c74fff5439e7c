"""Scratch: per cell, the GEMM chain's slowdown while the copy runs (from per-GEMM events)."""
import json, sys, numpy as np
d = json.load(open(sys.argv[1]))
per = int(sys.argv[2]) if len(sys.argv) > 2 else 4
for c in d["cells"]:
    row = c["row"]
    facs, wins, gx = [], [], []
    base = None
    for i, r in enumerate(c["reps"][2:]):
        ev = np.array(r["ev_s"]); g = np.diff(ev[:-1]); n = len(g)//per*per
        ch = g[:n].reshape(-1, per)
        if i % 2 == 0:
            base = np.median(ch[1:], axis=0); continue
        s = ch.sum(1); b = base.sum()
        slow = np.where(s[1:] > 1.25 * b)[0] + 1
        if len(slow) < 3:
            facs.append(1.0); wins.append(0.0); continue
        w = ch[slow[0]:slow[-1] + 1]
        facs.append(w.sum(1).mean() / b); wins.append(ev[slow[-1] * per + per] - ev[slow[0] * per])
        gx.append(np.median(w, axis=0) / base)
    gxs = " ".join("%.2f" % x for x in np.median(gx, axis=0)) if gx else "-"
    print(f"{c['cell']:70} ctas {str(row['ctas']):26} chain x{np.median(facs):.2f} [{min(facs):.2f}-{max(facs):.2f}] over {np.median(wins)*1e3:5.1f} ms (copy {row['copy_s']*1e3:5.1f}) per GEMM {gxs}")
