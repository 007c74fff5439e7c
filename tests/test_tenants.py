"""Tenants never share KV. Two tenants send the same prompts (the same Mooncake hash ids),
taking turns 10 s apart: each tenant's request finds exactly what its own previous request
cached, and nothing of the other's, on the sim and on the hw backend in CPU mode (where
the refcheck compares every reused page's bytes with its block key's pattern). Without
tenant fields the same trace shares, so the test can fail; ``workload.scope: session``
shares nothing across sessions at all."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.core.keys import chain_key, scope_root, tag_of
from kvsim.workload import TraceError, load_mooncake
from kvsim.workload.model import tenant_scope

runner = CliRunner()
MOONCAKE = "configs/mooncake-conversation.yaml"
ROUNDS = 4
BLOCK = 512   # the Mooncake trace's tokens a block


def _trace(path: Path, tenants: bool) -> Path:
    """Round k (1..4): tenant a, then tenant b 10 s later, each a prompt of the first k + 1
    blocks of one shared id sequence (each round's prompt extends the last one's)."""
    rows = []
    for k in range(1, ROUNDS + 1):
        for j, who in enumerate(("a", "b")):
            row = {"timestamp": (2 * (k - 1) + j) * 10_000, "input_length": BLOCK * (k + 1),
                   "output_length": 4, "hash_ids": list(range(1, k + 2))}
            if tenants:
                row["tenant"] = who
            rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _hits(folder: Path) -> list[int]:
    with open(folder / "requests.csv", newline="") as f:
        return [int(r["hit_gpu"]) + int(r["hit_host"]) + int(r["hit_disk"]) for r in csv.DictReader(f)]


def _expected(shared: bool) -> list[int]:
    """Hit tokens, request by request, from the scenario: a request finds the prompt of the
    latest earlier request it may share with (its whole prompt, which its own prompt
    extends), nothing if there is none."""
    out, seen = [], []   # seen: (tenant, prompt tokens) of the requests so far
    for k in range(1, ROUNDS + 1):
        for who in ("a", "b"):
            mine = [n for t, n in seen if shared or t == who]
            out.append(mine[-1] if mine else 0)
            seen.append((who, BLOCK * (k + 1)))
    return out


SIM = ["--no-progress", "--set", "model=llama-3-8b", "--set", "output.plots=false"]
HW = ["--backend", "hw", "--device", "cpu", "--time-scale", "20", "--no-progress",
      "--set", "model=llama-3-8b", "--set", "output.plots=false", "--set", "cache.tokens_per_block=32",
      "--set", "cache.page_bytes=4KiB",
      "--set", "cache.tiers=[{level: gpu, quota: 4MiB}, {level: host, quota: 4MiB}]"]


@pytest.mark.parametrize("backend", ["sim", "hw"])
def test_two_tenants_with_identical_prompts_never_hit_each_others_pages(tmp_path, backend):
    args = SIM if backend == "sim" else HW
    for tenants in (True, False):
        trace = _trace(tmp_path / f"t-{tenants}.jsonl", tenants)
        out = tmp_path / f"res-{tenants}"
        r = runner.invoke(app, ["run", MOONCAKE, "--trace", str(trace), *args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["engine"]["refcheck"] is True     # every reuse checked
        assert summary["metrics"]["requests_failed"] == 0
        assert _hits(out) == _expected(shared=not tenants), (backend, tenants)
    # the control differs: with tenants, b's first request found nothing of a's
    assert _expected(shared=False)[1] == 0 and _expected(shared=True)[1] == 2 * BLOCK


def test_scope_session_shares_nothing_across_sessions(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", tenants=True)
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", MOONCAKE, "--trace", str(trace), *SIM, "--out", str(out),
                            "--set", "workload.scope=session"])
    assert r.exit_code == 0, r.output
    assert _hits(out) == [0] * (2 * ROUNDS)      # each Mooncake request is a session of its own


def test_a_tenants_pages_carry_other_bytes_than_anothers():
    """The same trace block in two tenants' scopes: other block keys, so other content tags
    (the byte pattern the hw backend writes and its refcheck compares)."""
    a = chain_key(scope_root(tenant_scope("a", "global")), 1)
    b = chain_key(scope_root(tenant_scope("b", "global")), 1)
    assert a != b and tag_of(a) != tag_of(b)
    # a tenant's name cannot be chosen to reach another tenant's scope
    assert tenant_scope('a"|global', "x") != tenant_scope("a", '"|global|x')
    assert tenant_scope(None, "global") == "global"


@pytest.mark.parametrize("value, ok", [("acme", True), (42, True), ("", False), (True, False),
                                       ([1], False), ("x" * 257, False), (1.5, False)])
def test_the_tenant_field_is_checked_with_its_line(tmp_path, value, ok):
    row = {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "tenant": value}
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(row) + "\n")
    if ok:
        w = load_mooncake(p)
        assert w.sessions[0].tenant == str(value)
    else:
        with pytest.raises(TraceError, match=r"t\.jsonl:1: field 'tenant' must be a tenant or user id"):
            load_mooncake(p)


def test_agentic_sessions_of_two_tenants_never_share_even_a_shared_prefix(tmp_path):
    from kvsim.workload import load_agentic

    doc = json.loads((Path(__file__).resolve().parents[1] / "traces/fixtures/agentic_ok.json").read_text())
    for name, tenant in (("s1", "acme"), ("s2", "globex"), ("s3", "acme")):
        (tmp_path / f"{name}.json").write_text(json.dumps({**doc, "id": name, "tenant": tenant}))
    w = load_agentic(tmp_path, shared_prefix=True)
    scopes = {s.sid: s.scope for s in w.sessions}
    assert scopes["s1"] == scopes["s3"] != scopes["s2"]           # one tenant shares its prefix
    for s in w.sessions:                                           # sub-agents: their parent's
        assert all(i.scope == s.scope for i in s.items if hasattr(i, "scope"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "s.json").write_text(json.dumps({**doc, "tenant": {"x": 1}}))
    with pytest.raises(TraceError, match=r"s\.json: field 'tenant' must be a tenant or user id"):
        load_agentic(bad)
