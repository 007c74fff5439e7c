"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-
pipe``: commands on the browser's fd 3, answers on its fd 4, each message JSON ended by a
NUL byte), for the tests that open a page as a person would: no port, no extra package.

``find_browser()``: the browser's path (``KVSIM_BROWSER``, else Debian's ``chromium`` or
another Chromium or Chrome on the PATH), or None: the browser tests skip only then.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome",
         "headless_shell")


def find_browser() -> str | None:
    given = os.environ.get("KVSIM_BROWSER")
    if given:
        return shutil.which(given) or (given if os.access(given, os.X_OK) else None)
    for n in NAMES:
        p = shutil.which(n)
        if p:
            return p
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless browser process and one page (tab) in it."""

    def __init__(self, path: str, width: int = 1400, height: int = 1000, timeout: float = 60.0):
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="kvsim-browser-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:   # in the child: its end of each pipe on fds 3 and 4
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [path, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--hide-scrollbars", "--mute-audio",
                f"--user-data-dir={self._profile.name}", f"--window-size={width},{height}",
                "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, preexec_fn=fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._answers: dict[int, queue.Queue] = {}
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()   # drained
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")
        self.page("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._answers.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.put(msg)
        self.events.put({"method": "closed"})

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        with self._lock:
            self._next += 1
            n = self._next
            q: queue.Queue = queue.Queue()
            self._answers[n] = q
        msg = {"id": n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        try:
            answer = q.get(timeout=self.timeout)
        except queue.Empty:
            raise CDPError(f"{method}: no answer within {self.timeout} s") from None
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def page(self, method: str, params: dict | None = None) -> dict:
        return self.call(method, params, self.session)

    def wait_event(self, method: str) -> dict:
        """The next event ``method`` of the page; events before it are kept in ``seen``."""
        end = time.monotonic() + self.timeout
        while time.monotonic() < end:
            try:
                ev = self.events.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(ev)
            if ev.get("method") == "closed":
                raise CDPError(f"the browser closed while waiting for {method}")
            if ev.get("method") == method and ev.get("sessionId") == self.session:
                return ev
        raise CDPError(f"no {method} within {self.timeout} s")

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        nav = self.page("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise CDPError(f"{url}: {nav['errorText']}")
        self.wait_event("Page.loadEventFired")

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (a promise awaited)."""
        r = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise CDPError(f"{expression[:80]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A left click as a mouse makes it (press, release) at page coordinates in view."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                   "clickCount": 1})

    def screenshot(self, max_height: int = 6000) -> bytes:
        """The whole page (up to ``max_height`` CSS pixels) as PNG bytes."""
        import base64

        size = self.page("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height),
                "scale": 1}
        r = self.page("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                 "captureBeyondViewport": True})
        return base64.b64decode(r["data"])

    def exceptions(self) -> list[dict]:
        """The page's uncaught JavaScript errors seen so far."""
        while True:
            try:
                self.seen.append(self.events.get_nowait())
            except queue.Empty:
                break
        return [e for e in self.seen if e.get("method") == "Runtime.exceptionThrown"]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
