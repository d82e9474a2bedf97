"""The HTML report: a structural check with html.parser that always runs, and a headless-Chromium check that the
page a browser builds has the plots and the findings table (skipped, with the reason, where Chromium is absent)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flashcheck.findings import Finding, Location
from flashcheck.reports import render
from flashcheck.reports.html import PLOT_IDS
from flashcheck.rundir import load_run

SIGNATURE_RE = re.compile(r"^[0-9a-f]{16}$")


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: str = ""

    def iter(self) -> Iterable[Node]:
        yield self
        for c in self.children:
            yield from c.iter()

    def find_all(self, tag: str, **attrs: str) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and all(n.attrs.get(k) == v for k, v in attrs.items())]

    def by_id(self, id_: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == id_]
        assert len(found) == 1, f"expected one element with id={id_!r}, found {len(found)}"
        return found[0]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


_VOID = {"meta", "link", "input", "br", "img", "hr", "path", "circle", "rect", "line"}


class TreeBuilder(HTMLParser):
    """A DOM good enough for assertions; fails on mis-nested tags so broken markup does not pass unnoticed."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID and self.stack[-1].tag != tag:
            return  # an explicit </circle> etc. after a void-treated start tag
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].text += data


def parse(html: str) -> Node:
    b = TreeBuilder()
    b.feed(html)
    b.close()
    assert [n.tag for n in b.stack] == ["#root"], f"unclosed tags: {[n.tag for n in b.stack]}"
    return b.root


def _check_report_dom(root: Node, n_findings: int) -> None:
    table = root.by_id("findings-table")
    rows = [r for r in table.find_all("tr") if "data-severity" in r.attrs]
    assert len(rows) == n_findings
    for pid in PLOT_IDS:
        el = root.by_id(pid)
        assert el.tag == "svg", f"{pid} is a <{el.tag}>, not a plot"
    workspace = root.by_id("plot-workspace")
    assert len(workspace.find_all("circle")) > 100  # one dot per step and workspace
    assert any(c.attrs.get("stroke") == "#dc2626" for c in workspace.find_all("circle"))  # used > allocated
    assert len(root.by_id("plot-batch-sizes").find_all("rect")) > 10
    timeline = root.by_id("plot-first-finding")
    assert [g.attrs["data-key"] for g in timeline.find_all("g")] == ["FC102", "FC203", "FC301", "FC304"]
    assert len(timeline.find_all("path")) == 3  # first-finding markers; the static check has no step
    groups = [d.attrs["id"] for d in root.find_all("details") if d.attrs.get("class") == "group"]
    assert groups == ["group-FC102", "group-FC203", "group-FC301", "group-FC304"]
    # each group embeds its check's page, and each finding links to it (there is no web site to link to)
    assert "What it checks" in root.by_id("page-FC301").all_text()
    assert any(a.attrs.get("href") == "#page-FC301" for a in root.by_id("group-FC301").find_all("a"))
    finding = root.by_id(next(a for a in (r.find_all("a")[0].attrs["href"][1:] for r in rows) if "f-" in a))
    assert SIGNATURE_RE.match(finding.attrs["id"][2:])
    env = root.by_id("environment-table").all_text()
    assert "NVIDIA H100 80GB HBM3" in env and "2.13.0+cu130" in env and "0.6.13" in env and "1234" in env


def test_html_structure(run_dir: Path, baseline_dir: Path) -> None:
    html = render(load_run(run_dir), "html", run_dir=run_dir, baseline=load_run(baseline_dir))
    root = parse(html)
    _check_report_dom(root, 5)
    # grouped by property with reproducer and stack / call chain
    fc203 = root.by_id("group-FC203").all_text()
    assert "Stack (innermost last)" in fc203 and "init_forward_metadata_replay_cuda_graph" in fc203
    assert '"check": "FC203"' in fc203  # the reproducer file's content is embedded
    assert "Call chain (outermost first)" in root.by_id("group-FC102").all_text()
    assert "fixed" in root.by_id("fixed-table").all_text()
    assert "illegal memory access" in root.by_id("errors").all_text()


def test_html_is_self_contained(run_dir: Path) -> None:
    html = render(load_run(run_dir), "html", run_dir=run_dir)
    root = parse(html)
    loaded = [
        n
        for n in root.iter()
        if n.tag in ("script", "img", "iframe", "link", "audio", "video", "source")
        and ("src" in n.attrs or "href" in n.attrs)
    ]
    assert loaded == [], "the report must not load anything: inline CSS/JS/SVG only"
    styles = "".join(n.all_text() for n in root.find_all("style"))
    assert "@import" not in styles and "url(" not in styles
    assert len(root.find_all("script")) == 1 and len(root.find_all("style")) == 1


def test_html_escapes_untrusted_text(tmp_path: Path, make_run: Callable[..., Path]) -> None:
    evil = Finding(
        id="FC301",
        name="csr-well-formed",
        kind="property",
        message="<script>alert(1)</script> & more",
        location=Location(target="<b>t</b>", step=1),
    )
    d = make_run(tmp_path / "evil", [evil], [], errors=["<img src=x onerror=alert(1)>"])
    html = render(load_run(d), "html", run_dir=d)
    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in html
    root = parse(html)
    assert len(root.find_all("script")) == 1
    for pid in ("plot-workspace", "plot-batch-sizes", "plot-kv-tokens"):  # no samples: say so, draw no empty frame
        assert "empty" in root.by_id(pid).attrs.get("class", "")
    assert "no sampled step" in root.by_id("plot-first-finding").all_text()


# ---- headless browser -----------------------------------------------------------------------------------------------
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = _chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_html_in_headless_browser(run_dir: Path, baseline_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render(load_run(run_dir), "html", run_dir=run_dir, baseline=load_run(baseline_dir)), "utf-8")
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=2000",
        "--dump-dom",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<svg" in dom, f"chromium printed no page: {proc.stderr[-1000:]}"
    root = parse(dom.replace("<html", "<!DOCTYPE html><html", 1) if "<!DOCTYPE" not in dom else dom)
    _check_report_dom(root, 5)
    # the script ran: the shown-count it maintains and the details it opens are in the live DOM
    assert root.by_id("shown-count").all_text() == "5"
    shot = tmp_path / "report.png"
    proc = subprocess.run(
        [*cmd[:-2], "--hide-scrollbars", "--window-size=1400,2400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0 and shot.stat().st_size > 50_000, "the screenshot of the report is (nearly) blank"


def test_a_workspace_step_that_used_nothing_is_counted_not_plotted_at_one_byte() -> None:
    from flashcheck.reports import build_view, render_view
    from flashcheck.rundir import RunResult, Sample

    samples = [
        Sample(t=0.1 * i, step=i, op="replay", target="t", total_qo=4, total_kv=64 * (i + 1),
               workspaces={"float": (0 if i < 2 else 4096 * i, 1 << 20)})
        for i in range(5)
    ]  # fmt: skip
    html = render_view(
        build_view(RunResult(meta={"kind": "fuzz", "finished": 1.0}, findings=[], samples=samples)), "html"
    )
    assert "2 step(s) used 0 bytes (not plotted)" in html
    assert "used 0 B of" not in html  # no point (and no tooltip) for them
