"""How two ranks' steps share one GPU on the hw backend: what each kind of step loses to
another rank's step running at once on the same GPU.

Two ranks on one GPU each launch their steps on their own compute stream (the hw
backend's ranks: threads of one process, ``node.ranks_per_gpu``). Each cell pairs a
*victim* step (about ``--victim-ms`` of one kind) with an *other* step (three times as
long, launched first, so that it covers the victim's whole run) on a second stream; the
victim's GPU time (CUDA events on its stream) with the other beside it, over its time
alone: its stretch. Kinds (the stand-in's work, ``kvsim_backends.hw.standin``):

- ``prefill-256`` / ``prefill-4096``: a prefill chunk of 256 / 4096 tokens (tensor-core
  GEMM chains at M = 256 / 4096: kernels of tens to hundreds of microseconds);
- ``decode``: a decode step of 4 requests at 32K context (HBM reads in kernels of
  ``--chunk-ms``, the stand-in's ``hw.compute_chunk_s``).

Two rules the sim could take for steps that run at once, printed beside each cell:
processor sharing (each of n at 1/n: stretch 2.0) and sharing by kernel length (the
streams' kernels take turns, so a step's share is its kernel's length over the sum of
both steps' kernel lengths: stretch (k_v + k_o) / k_v), with each kind's kernel length
measured here (its GPU time alone over its kernels).

    python3 benchmarks/hw_rank_share.py [--victim-ms 20] [--chunk-ms 0.5,0.1] [--reps 5]
        [--model llama-3-8b] [--json OUT]

Needs CuPy and a CUDA GPU. Prints ``rank_share_kernel_rule_closer: K of N`` last: the
cells where the kernel-length rule is closer to the measured stretch than processor
sharing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.engine.compute import ComputeModel, load_model  # noqa: E402
from kvsim.run.seam import settings_for  # noqa: E402
from kvsim_backends.hw.backend import HwBackend  # noqa: E402
from kvsim_backends.hw.gpu import load_cupy  # noqa: E402
from kvsim_backends.hw.runtime import RealtimeRuntime  # noqa: E402
from kvsim_backends.hw.standin import plan  # noqa: E402

PROFILE = "h200-pcie-calibrated"


def works(model: str) -> dict:
    m = ComputeModel(load_model(model), load_profile(PROFILE))
    return {"prefill-256": m.step_work([(256, 0)], 0, 0), "prefill-4096": m.step_work([(4096, 0)], 0, 0),
            "decode": m.decode_work(4, 4 * 32768)}


def kernels_of(si, seconds: float, work) -> int:
    """The kernels the stand-in launches for ``seconds`` of ``work``."""
    _, gemms, read_s = plan(seconds, work, si.model, si.chain_s)
    per = max(1, int(si.chunk_s * si.read_Bps / (64 << 10)))
    ctas = int(read_s * si.read_Bps / (64 << 10)) if read_s > 0 else 0
    return len(si.model.projections) * sum(k for _, k in gemms) + -(-ctas // per)


def timed(cp, si, stream, seconds: float, work, other=None) -> float:
    """GPU seconds of ``seconds`` of ``work`` on ``stream``, with ``other`` = (stream,
    seconds, work) launched just before it (None: alone)."""
    if other is not None:
        si.launch(other[0], other[1], other[2])
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(stream)
    si.launch(stream, seconds, work)
    b.record(stream)
    b.synchronize()
    if other is not None:
        other[0].synchronize()
    return cp.cuda.get_elapsed_time(a, b) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--victim-ms", type=float, default=20.0)
    ap.add_argument("--chunk-ms", default="0.5,0.1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cp = load_cupy()
    if cp is None:
        sys.exit("hw_rank_share.py needs CuPy and a CUDA GPU")
    rows, closer = [], 0
    for chunk_ms in [float(x) for x in a.chunk_ms.split(",")]:
        rt = RealtimeRuntime()
        be = HwBackend(rt, settings_for(64 << 10, {Level.GPU: 4}, load_profile(PROFILE), device="gpu",
                                        model=a.model, compute_chunk_s=chunk_ms / 1e3))
        try:
            si = be.standin
            s1 = cp.cuda.Stream(non_blocking=True)
            s2 = cp.cuda.Stream(non_blocking=True)
            w = works(a.model)
            v_s = a.victim_ms / 1e3
            alone, klen = {}, {}
            for kind, work in w.items():
                for _ in range(2):  # warm
                    timed(cp, si, s1, v_s, work)
                alone[kind] = statistics.median(timed(cp, si, s1, v_s, work) for _ in range(a.reps))
                klen[kind] = alone[kind] / max(1, kernels_of(si, v_s, work))
            for victim in w:
                for other in w:
                    got = statistics.median(
                        timed(cp, si, s1, v_s, w[victim], (s2, 3 * v_s, w[other])) for _ in range(a.reps))
                    x = got / alone[victim]
                    kr = (klen[victim] + klen[other]) / klen[victim]
                    near = abs(kr - x) < abs(2.0 - x)
                    closer += near
                    rows.append({"chunk_ms": chunk_ms, "victim": victim, "other": other,
                                 "alone_ms": alone[victim] * 1e3, "with_ms": got * 1e3, "stretch": x,
                                 "kernel_rule": kr, "ps_rule": 2.0,
                                 "victim_kernel_us": klen[victim] * 1e6, "other_kernel_us": klen[other] * 1e6})
                    print(f"chunk {chunk_ms:.2f} ms  {victim:>12} beside {other:>12}: "
                          f"{alone[victim] * 1e3:6.2f} -> {got * 1e3:6.2f} ms  x{x:.2f}  "
                          f"(kernel rule x{kr:.2f}, kernels {klen[victim] * 1e6:.0f} / {klen[other] * 1e6:.0f} us; "
                          f"processor sharing x2.00)", flush=True)
        finally:
            be.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"rank_share_kernel_rule_closer: {closer} of {len(rows)}")


if __name__ == "__main__":
    main()
