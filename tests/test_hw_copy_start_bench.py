"""benchmarks/hw_copy_start.py: the stamped copy kernel is the backend's, each rep's starts
read from the stamps, a cell's delay beyond idle's, the figure it prints last, and its
refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_copy_start  # noqa: E402


def test_the_stamped_kernel_is_the_backends_copy_loop_with_a_stamp_first():
    from kvsim_backends.hw.gpu import COPY_SOURCE

    src = hw_copy_start.stamped_source(COPY_SOURCE)
    assert "kv_copy_stamped(" in src and "kv_copy_pages(" not in src
    assert "unsigned long long* __restrict__ stamps) {" in src
    head = src.index("kv_copy_stamped(")
    stamp = src.index("%%globaltimer", head)
    loop = src.index("for (long long w = blockIdx.x; w < items; w += gridDim.x)", head)
    assert stamp < loop  # each CTA stamps its start before it copies
    # the copy loop itself is the backend's, character for character
    body = COPY_SOURCE[COPY_SOURCE.index("const long long vecs"):COPY_SOURCE.index("kv_busy")]
    assert body in src
    assert "kv_clock(" in src and "kv_busy(" in src


def test_a_source_without_the_expected_signature_is_refused():
    with pytest.raises(ValueError, match="signature"):
        hw_copy_start.stamped_source("extern \"C\" __global__ void other() {}")


def test_starts_read_the_first_cta_after_its_launch_the_last_and_the_sms():
    # compute stamped at 1_000_000 ns; the host launched the copy 0.3 ms after it; CTAs
    # started at +0.40, +0.45 and +0.90 ms on SMs 3, 3 and 7
    stamps = [1_400_000, 3, 1_450_000, 3, 1_900_000, 7]
    got = hw_copy_start.starts(1_000_000, stamps, 0.0003)
    assert got["first_s"] == pytest.approx(0.0001)
    assert got["spread_s"] == pytest.approx(0.0005)
    assert got["sms"] == 2
    assert got["host_s"] == 0.0003


def test_a_cells_delay_is_its_median_first_start_beyond_idles():
    reps = [{"first_s": x, "spread_s": s, "sms": n, "host_s": h}
            for x, s, n, h in ((0.0004, 0.001, 4, 3e-4), (0.0006, 0.002, 4, 5e-4), (0.0005, 0.003, 5, 4e-4))]
    got = hw_copy_start.summarise(reps, 0.0001)
    assert got["delay_s"] == pytest.approx(0.0004)
    assert got["spread_s"] == pytest.approx(0.002)
    assert got["sms"] == 4
    assert got["host_lead_s"] == pytest.approx(4e-4)
    assert got["delays_s"] == pytest.approx([0.0003, 0.0005, 0.0004])


@pytest.mark.parametrize("args, words", [
    (["--rows", "256,x"], "--rows and --lead-ms take comma-separated numbers"),
    (["--lead-ms", "-1"], "--lead-ms numbers of at least 0"),
    (["--reps", "0"], "--reps take integers of at least 1"),
    (["--page", "4KiB"], "--page takes 16KiB to 4MiB"),
    (["--profile", "no-such-profile"], "no-such-profile"),
])
def test_bad_arguments_exit_2_naming_them(capsys, args, words):
    with pytest.raises(SystemExit) as e:
        hw_copy_start.main(args)
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def _gpu() -> bool:
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        return True
    except Exception:
        return False


def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    if _gpu():
        pytest.skip("a GPU is here")
    with pytest.raises(SystemExit) as e:
        hw_copy_start.main(["--rows", "256", "--reps", "1"])
    assert e.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_idle_copies_start_at_once_and_the_figure_is_printed(capsys, tmp_path):
    """On a GPU: the idle cells' delay is 0 by construction (their own baseline), every
    CTA of an idle launch starts within a millisecond of the first, and the last line is
    the figure, with the JSON written."""
    if not _gpu():
        pytest.skip("needs CuPy and a CUDA GPU")
    out = tmp_path / "start.json"
    hw_copy_start.main(["--rows", "256", "--lead-ms", "0.3", "--compute-ms", "5", "--reps", "3",
                        "--json", str(out)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("hw_copy_start_ms: gemm ")
    import json
    cells = json.loads(out.read_text())["cells"]
    idle = [c for c in cells if c["kind"] == "idle"]
    assert idle and all(c["delay_s"] == pytest.approx(0.0, abs=1e-12) for c in idle)
    assert all(c["spread_s"] < 1e-3 and c["sms"] >= 1 for c in idle)
    assert {c["kind"] for c in cells} == {"idle", "gemm", "reads"}
