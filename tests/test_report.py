"""``report.html``, the page every ``kvsim study`` and ``kvsim tune`` writes into its folder,
on a tiny study (6 points, 2 of them failing) and a tiny tune (2 trials).

Structural tests (always): the page parses, each tag closed in order; every ``<img>`` is an
inline PNG that decodes to the plot file's bytes at the size it declares; every header of
a sortable table has the sort handler, which the one script defines; every point that ran
links to its run folder; each point's config diff names exactly the keys it changes; the
study file's comment (its question) and an error message that carry HTML come out
escaped; the page is written whole and never over a user's file.

Browser test (where a Chromium can be had, tests/headless.py; skipped only where none
can): the page loaded from disk, every image decoded, a mouse click on a header sorts the
table by it (again: reversed), no script error, and a screenshot that is not blank.
"""

from __future__ import annotations

import base64
import os
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import load_config
from kvsim.run.outputs import MARKER, NAMES

runner = CliRunner()
QUESTION = 'Does a bigger GPU tier pay? <script>alert("x")</script> & "quotes"'
STUDY = f"""\
# {QUESTION}
#   kvsim study s.yaml
name: tiny
base: default
set:
  workload.synthetic.n_sessions: 2
  output.plots: false
grid:
  cache.tiers[0].quota: [4GiB, 24GiB]
variants:
  - {{name: hold, set: {{engine.hold_sessions: true}}}}
  - {{name: nohold, set: {{engine.hold_sessions: false}}}}
  - {{name: broken, set: {{workload.kind: mooncake, workload.path: TRACE}}}}
baseline: hold__quota=24GiB
"""
TUNE = """\
# Tune the GPU tier <i>and</i> the hold for TTFT.
name: t
base: default
set:
  workload.synthetic.n_sessions: 4
  output.plots: false
space:
  cache.tiers[0].quota: {type: int, low: 2, high: 12, unit: GiB}
  engine.hold_sessions: {type: categorical, choices: [true, false]}
objective:
  minimize: ttft_s.p90
trials: 3
split: {held_out: 0.34, seed: 1}
top: 2
"""
SET = "engine.max_batch_tokens=4096"   # --set: part of the base the diffs are taken from
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Page(HTMLParser):
    """The parts of a page the tests look at; raises on a tag closed out of order."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, dict]] = []
        self.imgs: list[dict] = []
        self.links: list[str] = []
        self.scripts: list[str] = []
        self.ths: list[tuple[dict, dict]] = []    # (th attrs, its table's attrs)
        self.details: dict[str, str] = {}         # id -> its text
        self.cells: dict[str, list[list[dict]]] = {}   # table id -> rows of td attrs
        self.text: list[str] = []
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed: {[t for t, _ in self.stack]}"

    def _within(self, tag: str) -> dict | None:
        for t, a in reversed(self.stack):
            if t == tag:
                return a
        return None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        if tag == "th":
            self.ths.append((a, self._within("table") or {}))
        if tag == "tr" and self._within("tbody") is not None:
            self.cells.setdefault((self._within("table") or {}).get("id", ""), []).append([])
        if tag == "td" and self._within("tbody") is not None:
            tid = (self._within("table") or {}).get("id", "")
            if tid in self.cells:
                self.cells[tid][-1].append(a)
        if tag not in VOID:
            self.stack.append((tag, a))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.stack and self.stack[-1][0] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1][0] == "script":
            self.scripts.append(data)
        self.text.append(data)
        for t, a in self.stack:
            if t == "details" and "id" in a:
                self.details[a["id"]] = self.details.get(a["id"], "") + data


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report-study")
    p = tmp / "s.yaml"
    # the broken variant's error names this path: HTML in an error message
    p.write_text(STUDY.replace("TRACE", str(tmp / "<b>later</b>" / "trace.jsonl")))
    out = tmp / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress",
                            "--set", SET])
    assert r.exit_code == 1, r.output   # the broken points fail; the others ran
    assert f"report: {out / 'report.html'}" in r.output
    return out


@pytest.fixture(scope="module")
def tune(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report-tune")
    p = tmp / "t.yaml"
    p.write_text(TUNE)
    out = tmp / "out"
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress",
                            "--set", SET])
    assert r.exit_code == 0, r.output
    assert f"report: {out / 'report.html'}" in r.output
    return out


def _images_are_the_plots(page: Page, folder: Path) -> None:
    plots = sorted((folder / "plots").glob("*.png"))
    assert plots and len(page.imgs) == len(plots)
    shown = []
    for img in page.imgs:
        head, data = img["src"].split(",", 1)
        assert head == "data:image/png;base64"
        raw = base64.b64decode(data, validate=True)
        assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
        w, h = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
        assert w > 0 and h > 0 and (int(img["width"]), int(img["height"])) == (w, h)
        shown.append(raw)
    assert sorted(shown) == sorted(p.read_bytes() for p in plots)


def _sortable(page: Page, script: str = "function kvsimSort(th)") -> None:
    assert len(page.scripts) == 1 and script in page.scripts[0]     # one script: the page's own
    ths = [a for a, table in page.ths if "sortable" in table.get("class", "")]
    assert ths and all(a.get("onclick") == "kvsimSort(this)" for a in ths)


def test_study_report_parses_inlines_its_plots_and_sorts(study):
    text = (study / "report.html").read_text(encoding="utf-8")
    page = Page(text)
    _images_are_the_plots(page, study)
    _sortable(page)
    assert {e.name for e in study.iterdir()} <= NAMES["study"] | {MARKER}   # no scratch file left
    # escaped: the question and the error message show as text, never as markup
    body = "".join(page.text)
    assert QUESTION in body and "<b>later</b>" in body
    assert '<script>alert("x")' not in text and "&lt;script&gt;alert(&quot;x&quot;)" in text
    assert "<b>later</b>" not in text and "&lt;b&gt;later&lt;/b&gt;" in text


def test_study_report_links_each_point_and_shows_its_config_diff(study):
    import pandas as pd

    page = Page((study / "report.html").read_text(encoding="utf-8"))
    assert f"--set: {SET}" in "".join(page.text)
    rows = pd.read_csv(study / "study.csv", keep_default_na=False).to_dict("records")
    assert len(page.cells["headline"]) == len(rows) == 6
    links = {unquote(h) for h in page.links}
    base = load_config("default")
    base_quota, base_hold = base.cache.tiers[0].quota, base.engine.hold_sessions
    for i, r in enumerate(rows):
        name = r["point"]
        ran = r["status"] in ("ok", "requests failed")
        assert (f"points/{name}/" in links) == ran == (study / "points" / name).is_dir(), name
        assert f"#diff-{i}" in links
        diff = page.details[f"diff-{i}"]
        assert diff.startswith(name + ":")
        expect = set()
        quota = {"4GiB": 4 * 2**30, "24GiB": 24 * 2**30}[r["quota"]]
        if quota != base_quota:
            expect.add("cache.tiers[0].quota")
        if r["variant"] == "nohold" and base_hold:
            expect.add("engine.hold_sessions")
        if r["variant"] == "broken":
            assert "workload.kind" in diff and "workload.path" in diff
            continue
        assert "max_batch_tokens" not in diff   # the --set is the base's
        keys = {k for k in ("cache.tiers[0].quota", "engine.hold_sessions", "workload.kind") if k in diff}
        assert keys == expect, (name, diff)
        assert f"{len(expect)} key" in diff


def test_tune_report_shows_the_best_config_its_held_out_gap_and_the_trials(tune):
    import pandas as pd
    import yaml

    text = (tune / "report.html").read_text(encoding="utf-8")
    page = Page(text)
    _images_are_the_plots(page, tune)
    _sortable(page)
    assert "<i>and</i>" not in text and "&lt;i&gt;and&lt;/i&gt;" in text
    assert f"--set: {SET}" in "".join(page.text)
    top = pd.read_parquet(tune / "top.parquet").to_dict("records")
    trials = pd.read_parquet(tune / "trials.parquet").to_dict("records")
    assert len(page.cells["top"]) == len(top) and len(page.cells["trials"]) == len(trials) == 3
    best = top[0]
    body = " ".join("".join(page.text).split())
    gap = (f"{round(best['gain.train'] * 100, 2) + 0.0:+.2f}% on the train sessions, "
           f"{round(best['gain.held_out'] * 100, 2) + 0.0:+.2f}% on the held-out")
    assert gap in body
    links = {unquote(h) for h in page.links}
    for r in top:
        assert f"trials/{r['trial']:04d}/" in links and f"held_out/{r['trial']:04d}/" in links
    assert {"best.yaml", "base/train/", "base/held_out/"} <= links
    # the best config against the base: exactly the searched keys whose value it changed
    chosen = yaml.safe_load((tune / "best.yaml").read_text())
    base = load_config("default")
    changed = {k for k, same in (("cache.tiers[0].quota", chosen["cache"]["tiers"][0]["quota"]
                                  == base.cache.tiers[0].quota),
                                 ("engine.hold_sessions", chosen["engine"]["hold_sessions"]
                                  == base.engine.hold_sessions)) if not same}
    section = body.split("Best config", 1)[1].split("Top trials", 1)[0]
    assert {k for k in ("cache.tiers[0].quota", "engine.hold_sessions") if k in section} == changed


def test_a_users_report_html_is_never_replaced(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(STUDY.replace("TRACE", "x.jsonl"))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.html").write_text("my own page")
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--force", "--no-progress"])
    assert r.exit_code == 2 and "report.html exists and kvsim did not write it" in r.output, r.output
    assert (out / "report.html").read_text() == "my own page"
    assert sorted(e.name for e in out.iterdir()) == ["report.html"]


# ------------------------------------------------------------------------ in a browser


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (module-scoped, so that it comes before the study and the tune:
    a machine without one skips at once)."""
    from headless import Browser, find_browser

    path = find_browser()
    if path is None:
        pytest.skip("no Chromium or Chrome on this machine (Debian: apt-get install chromium)")
    with Browser(path) as b:
        yield b


def _not_blank(png: bytes, where: Path) -> None:
    import io

    from PIL import Image

    where.write_bytes(png)
    shots = os.environ.get("KVSIM_REPORT_SCREENSHOTS")
    if shots:   # to look at by eye
        Path(shots).mkdir(parents=True, exist_ok=True)
        (Path(shots) / where.name).write_bytes(png)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    assert img.width >= 800 and img.height >= 600
    colours = img.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, f"{where}: {len(colours)} colours; the page looks blank"
    assert max(n for n, _ in colours) < 0.97 * img.width * img.height   # not one colour


DECODED = ("Promise.all(Array.from(document.images).map(function(i){return i.decode().then("
           "function(){return [i.naturalWidth, i.naturalHeight]},function(e){return [0, 0]})}))")


def _column(b, table: str, index: int) -> list[str]:
    return b.js(f"Array.from(document.querySelectorAll('#{table} tbody tr')).map("
                f"function(tr){{return tr.cells[{index}].getAttribute('data-v')}})")


def test_the_report_in_a_browser_shows_its_plots_and_sorts_on_a_click(browser, study, tune, tmp_path):
    import pandas as pd

    rows = pd.read_csv(study / "study.csv", keep_default_na=False).to_dict("records")
    metric = "ttft_s.p90"
    values = [r[metric] for r in rows]
    numbers = sorted(float(v) for v in values if v != "")
    blanks = sum(1 for v in values if v == "")
    assert numbers and blanks == 2
    b = browser
    b.open((study / "report.html").resolve().as_uri())
    sizes = b.js(DECODED)
    assert len(sizes) == len(list((study / "plots").glob("*.png"))) and all(w > 0 and h > 0 for w, h in sizes)
    where = b.js("(function(){var th=Array.from(document.querySelectorAll('#headline th')).find("
                 f"function(h){{return h.textContent.trim()==='{metric}'}});th.scrollIntoView();"
                 "var r=th.getBoundingClientRect();return [r.x+r.width/2, r.y+r.height/2, th.cellIndex]})()")
    x, y, col = where
    before = _column(b, "headline", col)
    b.click(x, y)
    up = _column(b, "headline", col)
    assert up != before   # the study's order (4 GiB before 24 GiB: a higher TTFT first) moved
    assert [float(v) for v in up[:len(numbers)]] == numbers and up[len(numbers):] == [""] * blanks
    b.click(x, y)
    down = _column(b, "headline", col)
    assert [float(v) for v in down[:len(numbers)]] == numbers[::-1] and down[len(numbers):] == [""] * blanks
    assert b.js(f"document.querySelectorAll('#headline th')[{col}].getAttribute('aria-sort')") == "descending"
    b.js("window.scrollTo(0, 0)")
    _not_blank(b.screenshot(), tmp_path / "study-report.png")
    b.open((tune / "report.html").resolve().as_uri())
    sizes = b.js(DECODED)
    assert len(sizes) == len(list((tune / "plots").glob("*.png"))) and all(w > 0 and h > 0 for w, h in sizes)
    _not_blank(b.screenshot(), tmp_path / "tune-report.png")
    assert b.exceptions() == []


# ------------------------------------------------------------------------ the parts alone


def test_a_config_diff_goes_as_deep_as_both_configs_share_a_shape():
    from kvsim.config.keypaths import ABSENT, config_diff

    base = {"name": "a", "cache": {"tiers": [{"quota": 1, "fill": None}, {"quota": 2}]}, "seed": 0}
    point = {"name": "b", "cache": {"tiers": [{"quota": 1, "fill": {"mode": "x"}}, {"quota": 3}]},
             "seed": 0, "extra": True}
    assert config_diff(base, point) == [("cache.tiers[0].fill", None, {"mode": "x"}),
                                        ("cache.tiers[1].quota", 2, 3), ("extra", ABSENT, True)]
    three = {**point, "cache": {"tiers": [{"quota": 1}] * 3}}   # another number of tiers: the list
    assert config_diff(base, three)[0] == ("cache.tiers", base["cache"]["tiers"], three["cache"]["tiers"])
    assert config_diff(base, base) == []


def test_a_files_leading_comment_reads_as_paragraphs_with_its_command_as_code(tmp_path):
    from kvsim.study.html_page import leading_comment, prose

    p = tmp_path / "s.yaml"
    p.write_text("\n# Does <b>this</b> pay\n# at all?\n#\n#   kvsim study s.yaml\nname: x\n# not this\n")
    text = leading_comment(p)
    assert text == "Does <b>this</b> pay\nat all?\n\n  kvsim study s.yaml"
    assert prose(text) == "<p>Does &lt;b&gt;this&lt;/b&gt; pay at all?</p><pre>kvsim study s.yaml</pre>"
    (tmp_path / "t.yaml").write_text("name: x\n")
    assert leading_comment(tmp_path / "t.yaml") == "" and leading_comment(tmp_path / "none.yaml") == ""


def test_a_tune_without_a_split_or_a_best_trial_still_gets_its_page(tmp_path):
    from kvsim.study.definition import load_tune
    from kvsim.study.html_report import write_tune_report

    p = tmp_path / "t.yaml"
    p.write_text(TUNE.replace("split: {held_out: 0.34, seed: 1}", "split: null"))
    spec = load_tune(p)
    trials = [{"trial": 0, "state": "FAIL", "value": None, "error": "RuntimeError: <boom>"}]
    page = write_tune_report(tmp_path, str(p), spec, {"seed": 0}, [], trials, None, [])
    text = page.read_text()
    parsed = Page(text)
    _sortable(parsed)
    assert "no trial completed within the constraints" in text and "no plots were drawn" in text
    assert "RuntimeError: &lt;boom&gt;" in text and "<boom>" not in text
    assert "none (the best configs are not re-evaluated)" in text
