"""The plan report in a real browser: headless Debian chromium driven over the DevTools pipe.

No extra Python package: :class:`Chromium` speaks the DevTools protocol over
``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated JSON). The tests load the page, wait
until its script sets ``#report-status[data-ready]``, then check lanes and bars counted in the
drawn SVG, JavaScript errors (page hook + DevTools exceptions and console errors), that no
request left the page (self-contained), and take a screenshot.

Also a tool: ``python tests/test_report_browser.py shot PAGE.html OUT.png [--width W]`` takes a
full-page screenshot; ``... time PAGE.html [--runs N]`` prints load-to-ready times.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_report import ODD_NAME, chain_graph, round_robin_plan, small_graph, small_plan

import baechi
from baechi.report import MAX_OP_BARS, MAX_TRANSFER_BARS, render_report, write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium not installed (apt-get install -y chromium; CI installs it)",
)
pytestmark = [pytest.mark.browser, needs_chromium]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]


class BrowserError(RuntimeError):
    """The browser died, timed out or answered a command with an error."""


class Chromium:
    """A headless chromium with one page, driven over the DevTools pipe."""

    def __init__(self, width: int = 1400, height: int = 900, timeout: float = 60.0) -> None:
        if CHROMIUM is None:
            raise BrowserError("chromium is not installed")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="baechi-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds() -> None:  # runs in the child: the pipe ends become fds 3 and 4
            a = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=child_fds,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.exceptions: list[str] = []
        self.console_errors: list[str] = []
        self.requests: list[str] = []
        self.session = self._attach(width, height)

    # ----------------------------------------------------------------- protocol
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._replies[-1] = {"error": {"message": "chromium closed the pipe"}}
                    self._cond.notify_all()
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._replies[message["id"]] = message
                        self._cond.notify_all()
                else:
                    self._on_event(message)

    def _on_event(self, message: dict[str, Any]) -> None:
        method = message.get("method", "")
        params = message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.exceptions.append(text)
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.console_errors.append(params["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            self.requests.append(params.get("request", {}).get("url", ""))
        self._events.put(message)

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = "page") -> dict[str, Any]:
        """Send one command and wait for its reply; raise :class:`BrowserError` on error."""
        self._next_id += 1
        command: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session == "page":
            command["sessionId"] = self.session
        elif session:
            command["sessionId"] = session
        os.write(self._to_chrome, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while self._next_id not in self._replies and -1 not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"{method}: no answer within {self.timeout:.0f} s")
                self._cond.wait(left)
            reply = self._replies.pop(self._next_id, None) or self._replies[-1]
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def _attach(self, width: int, height: int) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=None)
        attached = self.send("Target.attachToTarget",
                             {"targetId": target["targetId"], "flatten": True}, session=None)
        self.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.resize(width, height)
        return self.session

    # ----------------------------------------------------------------- page
    def resize(self, width: int, height: int) -> None:
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise})
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluate {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open_report(self, url: str, timeout: float = 120.0) -> dict[str, str]:
        """Navigate to a report and wait for ``#report-status[data-ready]``; its attributes."""
        self.exceptions.clear()
        self.console_errors.clear()
        self.requests.clear()
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + timeout
        probe = (
            "(function(){var s=document.getElementById('report-status');"
            "if(!s||s.getAttribute('data-ready')==='0')return null;"
            "var o={};for(var a of s.attributes)o[a.name]=a.value;return o;})()"
        )
        while time.monotonic() < deadline:
            try:
                status = self.evaluate(probe)
            except BrowserError:
                status = None  # the page is still loading
            if status:
                return status
            time.sleep(0.05)
        raise BrowserError(f"{url}: the report did not get ready within {timeout:.0f} s")

    def screenshot(self, path: str | Path, width: int) -> tuple[int, int]:
        """Full-page PNG at ``width`` CSS pixels; returns its size in pixels."""
        self.resize(width, 900)
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        self.resize(width, height)
        time.sleep(0.3)  # let plotly's responsive relayout settle
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return png_size(Path(path))

    def close(self) -> None:
        with contextlib.suppress(BrowserError):
            self.send("Browser.close", session=None)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


# --------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def browser() -> Any:
    with Chromium() as chromium:
        yield chromium


def _open(browser: Chromium, page: Path) -> dict[str, str]:
    status = browser.open_report(page.resolve().as_uri())
    assert status["data-ready"] == "1", status
    return status


def _no_errors(browser: Chromium, status: dict[str, str]) -> None:
    assert status["data-errors"] == "0", status.get("data-error-text")
    assert browser.exceptions == []
    assert browser.console_errors == []


def _plot_attrs(browser: Chromium) -> dict[str, int]:
    return browser.evaluate(
        "(function(){var o={};for(var a of document.getElementById('plot').attributes)"
        "if(a.name.startsWith('data-'))o[a.name]=parseInt(a.value);return o;})()"
    )


def test_small_plan_lanes_bars_no_errors(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "small.html"
    write_report(small_graph(), small_plan(), page)
    status = _open(browser, page)
    _no_errors(browser, status)
    # self-contained: nothing but the file itself was requested
    assert [u for u in browser.requests if not u.startswith(("file:", "data:", "about:"))] == []
    attrs = _plot_attrs(browser)
    # two devices, each with its op lane and its communication lane
    assert attrs["data-device-lanes"] == 2 and attrs["data-channel-lanes"] == 2
    assert int(status["data-rendered-lanes"]) == 4
    labels = browser.evaluate(
        "Array.from(document.querySelectorAll('#plot .ytick text')).map(t => t.textContent)")
    assert labels == ["/GPU:0", "/GPU:0 comm", "/GPU:1", "/GPU:1 comm"]
    # one bar per op, drawn; each transfer in both channels it holds (sequential mode)
    assert int(status["data-rendered-op-bars"]) == len(small_graph()["ops"]) == 6
    simulation = baechi.simulate_plan(small_graph(), small_plan())
    assert int(status["data-rendered-transfer-bars"]) == 2 * len(simulation.transfers)
    # one memory chart per device, limit drawn on each
    assert browser.evaluate("document.querySelectorAll('#plot .scatterlayer .trace').length") \
        == 2 * 3  # curve, peak marker, limit per device
    shot = tmp_path / "small.png"
    width, height = browser.screenshot(shot, 1200)
    assert width == 1200 and height >= 900
    assert shot.stat().st_size > 20_000


HOVER = """
(function (name) {
  var gd = document.getElementById('plot');
  var i = gd.data.findIndex(t => t.meta === 'ops' && t.customdata.some(c => c[0] === name));
  var p = gd.data[i].customdata.findIndex(c => c[0] === name);
  Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: p}]);
  return Array.from(gd.querySelectorAll('.hoverlayer .hovertext text'))
    .map(t => t.textContent).join('|');
})(%s)
"""


def test_hover_shows_op_details(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "hover.html"
    write_report(small_graph(), small_plan(), page)
    _open(browser, page)
    text = browser.evaluate(HOVER % json.dumps("b"))
    assert "b" in text and "type: Relu" in text and "start: 10.000 µs" in text
    assert "duration: 20.000 µs" in text and "/GPU:0" in text
    # an awkward name is shown as written, neither as markup nor with entities
    escaped = ODD_NAME.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    time.sleep(0.2)  # plotly throttles hover events
    text = browser.evaluate(HOVER % json.dumps(escaped))
    assert ODD_NAME in text and "type: Add" in text


def test_parallel_mode_and_one_device(browser: Chromium, tmp_path: Path) -> None:
    page = tmp_path / "parallel.html"
    plan = small_plan()
    plan["request"]["cluster"]["network"]["mode"] = "parallel"
    write_report(small_graph(), plan, page)
    status = _open(browser, page)
    _no_errors(browser, status)
    simulation = baechi.simulate_plan(small_graph(), plan)
    assert int(status["data-rendered-transfer-bars"]) == len(simulation.transfers)
    labels = browser.evaluate(
        "Array.from(document.querySelectorAll('#plot .ytick text')).map(t => t.textContent)")
    assert labels == ["/GPU:0", "/GPU:0 sends", "/GPU:1", "/GPU:1 sends"]

    single = baechi.place(small_graph(), {"devices": {"count": 1}}, "single")
    page = tmp_path / "single.html"
    write_report(small_graph(), single, page)
    status = _open(browser, page)
    _no_errors(browser, status)
    assert status["data-rendered-lanes"] == "1"
    assert status["data-rendered-op-bars"] == "6"


ZOOM = """
(async function (a, b) {
  var gd = document.getElementById('plot'), status = document.getElementById('report-status');
  var before = status.dataset.viewUpdates;
  await Plotly.relayout(gd, {'xaxis.range': [a, b]});
  for (var k = 0; k < 1000 && status.dataset.viewUpdates === before; k++) {
    await new Promise(function (ok) { setTimeout(ok, 10); });
  }
  var o = {};
  for (var x of status.attributes) o[x.name] = x.value;
  o.note = document.getElementById('zoom-note').textContent;
  return o;
})(%s, %s)
"""


def test_aggregated_page_draws_what_it_declares_and_details_on_zoom(
    browser: Chromium, tmp_path: Path
) -> None:
    graph = chain_graph(3000)
    plan = round_robin_plan(graph, 3)
    page = tmp_path / "big.html"
    page.write_text(render_report(graph, plan, max_op_bars=500, max_transfer_bars=300))
    status = _open(browser, page)
    _no_errors(browser, status)
    attrs = _plot_attrs(browser)
    assert attrs["data-op-bars"] <= 500 < attrs["data-ops"]
    assert int(status["data-rendered-op-bars"]) == attrs["data-op-bars"]
    assert int(status["data-rendered-transfer-bars"]) == attrs["data-transfer-bars"] <= 300
    assert browser.evaluate("!!document.getElementById('aggregation-note')")

    # zoom into a window holding fewer than 500 ops: each op in view gets its own bar
    sim = baechi.simulate_plan(graph, plan)
    start, end = np.array(sim.start), np.array(sim.end)
    a, b = float(np.quantile(start, 0.40)), float(np.quantile(start, 0.45))
    in_view = int(((start <= b) & (end >= a)).sum())
    assert 0 < in_view <= 500
    zoomed = browser.evaluate(ZOOM % (a, b), await_promise=True)
    assert zoomed["data-errors"] == "0", zoomed.get("data-error-text")
    assert zoomed["data-view"].startswith("ops:detail")
    assert int(zoomed["data-rendered-op-bars"]) == in_view
    assert f"all {in_view:,} ops in view are drawn one by one" in zoomed["note"]
    # the bars are the simulator's: hover the first op in view and read its start
    names = baechi.load_graph(graph).names
    first = int(np.flatnonzero((start <= b) & (end >= a))[0])
    text = browser.evaluate(HOVER % json.dumps(names[first]))
    assert f"start: {start[first]:,.3f} µs" in text

    # zooming back out restores the merged view
    full = browser.evaluate(
        "JSON.parse(document.getElementById('report-figure').textContent).layout.xaxis.range")
    time.sleep(0.2)
    back = browser.evaluate(ZOOM % tuple(full), await_promise=True)
    assert back["data-view"].startswith("ops:merged")
    assert int(back["data-rendered-op-bars"]) == attrs["data-op-bars"]
    assert back["note"] == ""
    _no_errors(browser, back)


def test_harness_catches_javascript_errors(browser: Chromium, tmp_path: Path) -> None:
    """The checks above would see a broken page: a failed plot and an uncaught error."""
    page = tmp_path / "broken.html"
    html = render_report(small_graph(), small_plan())
    html = html.replace("Plotly.newPlot(", "Plotly.noSuchFunction(")
    html = html.replace("</body>", "<script>window.setTimeout(noSuchName, 0);</script></body>")
    page.write_text(html)
    status = browser.open_report(page.resolve().as_uri())
    assert status["data-ready"] == "error"
    time.sleep(0.3)  # the timer's uncaught ReferenceError
    errors = browser.evaluate("document.getElementById('report-status').dataset.errors")
    assert int(errors) >= 2
    assert any("noSuchName" in e for e in browser.exceptions)


def test_20k_op_page_stays_responsive(browser: Chromium, tmp_path: Path) -> None:
    graph = chain_graph(20_000)
    page = tmp_path / "20k.html"
    write_report(graph, round_robin_plan(graph, 4), page)
    status = _open(browser, page)
    _no_errors(browser, status)
    attrs = _plot_attrs(browser)
    assert int(status["data-rendered-op-bars"]) == attrs["data-op-bars"] <= MAX_OP_BARS
    assert int(status["data-rendered-transfer-bars"]) == attrs["data-transfer-bars"]
    assert attrs["data-transfer-bars"] <= MAX_TRANSFER_BARS
    # generous bounds for a busy CI machine; typical here: 0.7-1.9 s and 0.2-0.5 s
    assert float(status["data-render-ms"]) < 20_000
    timings = browser.evaluate(INTERACTION, await_promise=True)
    assert timings["zoom_ms"] < 5_000 and timings["reset_ms"] < 5_000


def test_page_from_the_service(browser: Chromium, request: pytest.FixtureRequest) -> None:
    import service_fixtures

    if not hasattr(service_fixtures, "service"):
        pytest.skip("tests/service_fixtures.py has no `service` fixture (issue 4)")
    service = request.getfixturevalue("service")  # skips itself where redis-server is absent
    body = {"graph": small_graph(), "cluster": small_plan()["request"]["cluster"],
            "algorithm": "m-etf", "options": {"allow_single": False}}
    with service.client("key-a") as http:
        created = http.post("/placements", json=body)
        assert created.status_code == 202, created.text
        pid = created.json()["id"]
    finished = service.wait(pid)
    assert finished["status"] == "finished", finished
    url = f"{service.url}/placements/{pid}/report"
    # a browser cannot send X-API-Key on a plain navigation: without it the page is refused
    browser.send("Page.navigate", {"url": url})
    deadline = time.monotonic() + 30
    while browser.evaluate(f"location.href === {json.dumps(url)} && "
                           "document.readyState === 'complete'") is not True:
        assert time.monotonic() < deadline, "the refused page did not load"
        time.sleep(0.05)
    assert browser.evaluate("document.getElementById('report-status')") is None
    refused = browser.evaluate("document.body.innerText")
    assert "error" in refused and "key" in refused.lower(), refused
    # with the key as an extra header (what a proxy or the SDK does), the report renders
    browser.send("Network.setExtraHTTPHeaders",
                 {"headers": {"X-API-Key": service.keys["key-a"]}})
    try:
        status = browser.open_report(url)
    finally:
        browser.send("Network.setExtraHTTPHeaders", {"headers": {}})
    assert status["data-ready"] == "1", status
    _no_errors(browser, status)
    # nothing else is fetched (the report declares an inline icon; the refused JSON page
    # before it cannot, and Chromium may ask for its favicon after the next navigation began)
    assert [u for u in browser.requests if u not in (url, f"{service.url}/favicon.ico")] == []
    assert status["data-rendered-lanes"] == "4"
    assert status["data-rendered-op-bars"] == "6"
    with service.client("key-a") as http:
        served_plan = http.get(f"/placements/{pid}/plan").json()
    step = baechi.simulate(small_graph(), served_plan).step_time_us
    shown = browser.evaluate(
        "document.querySelector('[data-key=step_time_us] .detail').textContent")
    assert shown == f"{step:,.3f} µs"


# --------------------------------------------------------------------------- tool
#: Times a zoom into the middle tenth, a hover on an op bar, and the reset, in ms.
INTERACTION = """
(async function () {
  var gd = document.getElementById('plot'), status = document.getElementById('report-status');
  var r = gd.layout.xaxis.range.slice(), w = r[1] - r[0], out = {};
  var hasDetail = JSON.parse(document.getElementById('report-figure').textContent)
    .detail.length > 0;
  async function settled(before) {  // the page's zoom-detail update, when it has one
    if (!hasDetail) return;
    for (var k = 0; k < 400 && status.dataset.viewUpdates === before; k++) {
      await new Promise(function (ok) { setTimeout(ok, 10); });
    }
  }
  var t = performance.now(), before = status.dataset.viewUpdates;
  await Plotly.relayout(gd, {'xaxis.range': [r[0] + 0.45 * w, r[0] + 0.55 * w]});
  out.zoom_ms = +(performance.now() - t).toFixed(1);
  await settled(before);
  out.zoom_with_detail_ms = +(performance.now() - t).toFixed(1);
  out.view = status.dataset.view || '';
  var i = gd.data.findIndex(function (d) { return d.meta === 'ops' && d.base.length; });
  t = performance.now();
  Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: 0}]);
  out.hover_ms = +(performance.now() - t).toFixed(1);
  t = performance.now();
  before = status.dataset.viewUpdates;
  await Plotly.relayout(gd, {'xaxis.range': r});
  await settled(before);
  out.reset_ms = +(performance.now() - t).toFixed(1);
  return out;
})()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    shot = verbs.add_parser("shot", help="full-page screenshot of a report")
    shot.add_argument("page")
    shot.add_argument("png")
    shot.add_argument("--width", type=int, default=1600)
    timing = verbs.add_parser("time", help="load-to-ready time of a report")
    timing.add_argument("page")
    timing.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    url = Path(args.page).resolve().as_uri()
    with Chromium(width=getattr(args, "width", 1400)) as chromium:
        if args.verb == "shot":
            status = chromium.open_report(url)
            size = chromium.screenshot(args.png, args.width)
            print(f"{args.png}: {size[0]}x{size[1]} px, status {status}")
        else:
            for run in range(args.runs):
                tick = time.perf_counter()
                status = chromium.open_report(url)
                wall = time.perf_counter() - tick
                print(f"run {run}: ready {status.get('data-ready')}, plot drawn in "
                      f"{status.get('data-render-ms')} ms, ready {status.get('data-ready-ms')} "
                      f"ms after navigation start, {wall:.2f} s wall (incl. polling), "
                      f"errors {status.get('data-errors')}")
            print("interaction:", chromium.evaluate(INTERACTION, await_promise=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
