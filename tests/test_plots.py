"""The replay plots draw link traffic from the counters both backends report."""

import warnings
from types import SimpleNamespace

import pytest

from kvsim.run.plots import write_plots

pytest.importorskip("matplotlib")


def _timeline(extra_sim_keys: bool):
    rows = []
    for i in range(4):
        r = {"t_s": float(i), "gpu_used_slots": i, "host_used_slots": 0,
             "host_to_gpu": i * 1e9, "gpu_to_host": i * 2e9, "disk_read": 0, "disk_write": i * 1e8}
        if extra_sim_keys:
            r["h2d_bytes"] = r["host_to_gpu"]
        rows.append(r)
    return rows


@pytest.mark.parametrize("extra_sim_keys", [False, True], ids=["hw-counters", "sim-counters"])
def test_timeline_plot_from_common_counters(tmp_path, extra_sim_keys):
    import matplotlib.pyplot as plt

    drawn = []
    real_savefig = plt.Figure.savefig

    def spy(fig, *a, **kw):  # record the traffic panel's lines before the figure closes
        drawn.append([ln.get_label() for ln in fig.axes[1].lines] if len(fig.axes) > 1 else None)
        return real_savefig(fig, *a, **kw)

    result = SimpleNamespace(timeline=_timeline(extra_sim_keys), rows=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty panel's legend warns: no warning allowed
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(plt.Figure, "savefig", spy)
            written = write_plots(result, tmp_path)
    assert [p.name for p in written] == ["timeline.png"]
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert drawn[0] == ["host to gpu", "gpu to host", "disk read", "disk write"]
