"""Seed 000's lasting step penalty on ``gh200-c2c``: the profile's gap per kernel times a
step's kernels (layers x ``engine.kernels_per_layer``) against kvsim's decode step (one
request, its work on the profile + ``compute.latency``) at a 2K and a 393K context, with 8
and 16 kernels a layer, beside the seed's shares (+7.0% at 2K: the fitted figure; about
+4% at 393K and +13.5% "with more kernels": predicted here; the seed does not give that
configuration's kernel count, so 16 a layer, twice the default, is an assumption).
The sim adds exactly this to every step once the kernel has run
(``tests/test_copy_c2c.py``). Last line: ``lasting_share_393k_70b: value`` (percent).

    python benchmarks/lasting_penalty.py
"""

from __future__ import annotations

from kvsim.config.hardware import load_profile
from kvsim.engine.compute import ComputeModel, load_model

SEED = {(2000, 8): "+7.0% (fitted)", (393_000, 8): "about +4%", (2000, 16): "+13.5% (more kernels)"}


def main() -> None:
    p = load_profile("gh200-c2c")
    gap = p.sm.interference.lasting_gap_per_kernel
    share_393k_70b = 0.0
    for model in ("llama-3-70b", "llama-3-8b"):
        shape = load_model(model)
        cm = ComputeModel(shape, p)
        for ctx in (2000, 393_000):
            step = cm.decode_work(1, ctx).seconds + p.compute.latency
            for k in (8, 16):
                pen = gap * shape.layers * k
                seed = SEED.get((ctx, k), "") if model == "llama-3-70b" else ""
                print(f"{model:<12} ctx {ctx:>7,} kernels/layer {k:>2}: step {step * 1e3:7.2f} ms, "
                      f"penalty {pen * 1e3:5.3f} ms = {pen / step:+6.1%}   seed: {seed}")
                if model == "llama-3-70b" and ctx == 393_000 and k == 8:
                    share_393k_70b = 100 * pen / step
    print(f"lasting_share_393k_70b: {share_393k_70b:.2f}")


if __name__ == "__main__":
    main()
