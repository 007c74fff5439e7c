"""benchmarks/interrupt_study.py: its arguments checked, and one round that ends clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "interrupt_study.py"


@pytest.mark.parametrize("args", [["--delay", "3,1"], ["--delay", "x"], ["--rounds", "0"]])
def test_bad_arguments_exit_2_naming_them(args):
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert args[0] in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="process groups and ps as on Linux")
def test_one_round_interrupted_while_points_run(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--delay", "1.5,1.5",
                        "--keep", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "interrupt_study_clean: 1 of 1", r.stdout + "".join(
        f.read_text() for f in tmp_path.iterdir())
