"""What a study's plots write on their axes: a summary metric's or a config key's name in
words, with its unit, and the factor that puts its values in that unit.

``metric_label("ttft_s.p90")`` -> ``("TTFT p90 (s)", 1.0)``; ``metric_label("bytes.disk_read")``
-> ``("bytes read from disk (GB)", 1e-9)``. ``axis_label("cache.tiers[1].quota", "host")`` ->
``("host: cache.tiers[1].quota (GiB)", 2**-30)``: a size field's values in GiB, a duration's
in s, other keys by a small table of units (tokens, requests, fractions). A path the tables
do not know keeps its name and says ``(count)``, never nothing.
"""

from __future__ import annotations

import typing

from kvsim.config import RunConfig
from kvsim.config.keypaths import KeyPathError, field_at, parse_key

PERCENTILES = {"mean": "mean", "p50": "p50", "p90": "p90", "p99": "p99", "max": "max", "min": "min"}

# summary metric root -> (words, unit, scale)
METRICS: dict[str, tuple[str, str, float]] = {
    "ttft_s": ("TTFT", "s", 1.0), "tpot_s": ("TPOT", "s", 1.0), "e2e_s": ("E2E latency", "s", 1.0),
    "ttft_host_hit_s": ("TTFT of turns with a host hit", "s", 1.0),
    "decode_step_s": ("decode-only step", "s", 1.0), "ttft_s_by_input": ("TTFT by input size", "s", 1.0),
    "hit_ratio": ("hit ratio", "fraction of input tokens", 1.0),
    "requests_completed": ("requests completed", "requests", 1.0),
    "requests_failed": ("requests failed", "requests", 1.0),
    "input_tokens": ("input tokens", "tokens", 1.0), "output_tokens": ("output tokens", "tokens", 1.0),
    "hit_tokens": ("hit tokens", "tokens", 1.0), "computed_tokens": ("computed tokens", "tokens", 1.0),
    "bytes": ("bytes", "GB", 1e-9), "evicted_pages": ("evicted pages", "pages", 1.0),
    "dropped_pages": ("dropped pages", "pages", 1.0), "offloaded_pages": ("offloaded pages", "pages", 1.0),
    "onboarded_pages": ("onboarded pages", "pages", 1.0), "failed_batches": ("failed batches", "batches", 1.0),
    "preemptions": ("preemptions", "count", 1.0), "holds_released": ("session holds released", "count", 1.0),
    "engine_steps": ("engine steps", "steps", 1.0), "decode_steps": ("decode-only steps", "steps", 1.0),
    "sim_time_s": ("simulated time", "s", 1.0), "wall_time_s": ("wall time", "s", 1.0),
    "page_bytes": ("page size", "bytes", 1.0), "tiers_slots": ("tier slots", "slots", 1.0),
    "disk_copies": ("disk copies", "count", 1.0),
}
THROUGHPUT = {"requests_per_s": ("throughput", "requests/s"),
              "output_tokens_per_s": ("output throughput", "tokens/s"),
              "input_tokens_per_s": ("input throughput", "tokens/s")}
BYTES = {"host_to_gpu": "host to GPU", "gpu_to_host": "GPU to host", "disk_read": "read from disk",
         "disk_write": "written to disk"}

# config key (last name) -> unit, for keys that are neither sizes nor durations
KEY_UNITS = {"max_batch_tokens": "tokens", "tokens_per_block": "tokens", "max_running": "requests",
             "n_sessions": "sessions", "io_workers": "workers", "sessions_per_s": "sessions/s",
             "concurrency": "sessions", "gpu_free_watermark": "fraction of GPU slots",
             "io_write_share": "fraction of the I/O workers",
             "protected_copy_fraction": "fraction of the disk copies", "limit": "sessions or requests",
             "max_turns": "turns", "requests": "requests", "input_tokens": "tokens",
             "output_tokens": "tokens", "prefix_tokens": "tokens", "max_context_tokens": "tokens",
             "first_input_tokens": "tokens", "step_input_tokens": "tokens", "tp": "GPUs",
             "time_scale": "x", "subagent_prob": "probability", "sm_ctas": "CTAs",
             "max_plan_failures": "count", "seed": "number"}


def metric_label(path: str) -> tuple[str, float]:
    """(a summary metric's name in words with its unit, the factor into that unit)."""
    parts = path.split(".")
    root, rest = parts[0], parts[1:]
    if root == "throughput" and rest and rest[0] in THROUGHPUT:
        words, unit = THROUGHPUT[rest[0]]
        return f"{words} ({unit})", 1.0
    if root == "bytes" and rest:
        return f"bytes {BYTES.get(rest[0], rest[0].replace('_', ' '))} (GB)", 1e-9
    if root == "host_fill" and rest:
        unit = "s" if rest[-1].endswith("_s") else "slots"
        return f"host fill {rest[-1].removesuffix('_s').replace('_', ' ')} ({unit})", 1.0
    if root == "ttft_s_by_input" and len(rest) == 2:   # {short, long}.{percentile}
        return f"TTFT of {rest[0]} prompts {PERCENTILES.get(rest[1], rest[1])} (s)", 1.0
    if root in METRICS:
        words, unit, scale = METRICS[root]
        tail = " ".join(PERCENTILES.get(r, r.replace("_", " ")) for r in rest)
        return f"{words}{' ' + tail if tail else ''} ({unit})", scale
    unit = "s" if root.endswith("_s") else "count"
    return f"{path} ({unit})", 1.0


def _validators(field) -> set[str]:
    """The names of the validators a field's type carries (Optional and Annotated opened)."""
    if field is None:
        return set()
    metas = list(field.metadata)
    stack = [field.annotation]
    while stack:
        t = stack.pop()
        if typing.get_origin(t) is typing.Annotated:
            metas += list(t.__metadata__)
        stack += list(typing.get_args(t))
    return {getattr(getattr(m, "func", None), "__name__", "") for m in metas}


def axis_label(key: str | None, label: str) -> tuple[str, float]:
    """(an axis' name with its unit, the factor into that unit) for the config key behind
    the study's column ``label`` (None: the column is not a config key, e.g. ``seed``)."""
    if key is None:
        return (f"{label} ({KEY_UNITS.get(label, 'count')})", 1.0)
    try:
        field = field_at(parse_key(key), RunConfig)
    except KeyPathError:
        field = None
    funcs = _validators(field)
    name = key if key == label or key.endswith("." + label) else f"{label}: {key}"
    if "_size" in funcs:
        return f"{name} (GiB)", 2.0 ** -30
    if "parse_time" in funcs:
        return f"{name} (s)", 1.0
    last = key.rsplit(".", 1)[-1].split("[")[0]
    return f"{name} ({KEY_UNITS.get(last, 'count')})", 1.0
