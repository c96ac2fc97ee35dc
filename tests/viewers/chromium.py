#!/usr/bin/env python3
"""Loads weft's output into real viewers in headless Chromium and prints, as
JSON, what they show.

    chromium.py speedscope INDEX_HTML TRACE_JSON [SCREENSHOT_PNG]
        speedscope's web app imports the Chrome trace through its own file
        input (as a user's "Browse" does); for every profile it made (one
        per thread), its title and the Sandwich view's table: each
        function's total and self time in nanoseconds, as speedscope
        computed them.  {"profiles": [{"title", "rows": [{"name", "total_ns",
        "self_ns"}]}]}, or {"error": TEXT} if speedscope showed one.

    chromium.py svg SVG_FILE [SCREENSHOT_PNG]
        Chromium renders the SVG; every frame (<g> with a <title>) with the
        width of its rectangle as laid out.  {"width", "frames": [{"title",
        "width"}]}

Talks to Chromium over the DevTools protocol on a pipe
(--remote-debugging-pipe), with nothing but the standard library.
"""

import base64
import json
import os
import re
import subprocess
import sys
import time

CHROME = os.environ.get("WEFT_CHROMIUM", "chromium-headless-shell")


class Browser:
    def __init__(self):
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()

        def child():
            # Chromium reads fd 3 and writes fd 4; the pipes may already be
            # fds 3 and 4, so lift them above first.
            a, b = os.dup(commands_r), os.dup(replies_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [CHROME, "--headless", "--no-sandbox", "--disable-gpu",
             "--enable-unsafe-swiftshader", "--allow-file-access-from-files",
             "--window-size=1280,800", "--remote-debugging-pipe", "about:blank"],
            close_fds=False, preexec_fn=child,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(commands_r)
        os.close(replies_w)
        self.out = os.fdopen(commands_w, "wb")
        self.inp = replies_r
        self.buf = b""
        self.next_id = 0
        self.session = None

    def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        self.out.write(json.dumps(msg).encode() + b"\0")
        self.out.flush()
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.inp, 1 << 16)
                if not chunk:
                    sys.exit("chromium closed its DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    sys.exit("%s: %s" % (method, reply["error"]))
                return reply["result"]

    def open(self, url):
        target = self.call("Target.createTarget", {"url": url}, False)["targetId"]
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, False
        )["sessionId"]

    def eval(self, expr):
        result = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return result["result"].get("value")

    def wait_for(self, expr, what, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            value = self.eval(expr)
            if value:
                return value
            time.sleep(0.1)
        sys.exit("chromium: %s did not happen within %d s" % (what, seconds))

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except SystemExit:
            pass
        self.proc.wait(timeout=10)


UNITS = {"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9, "min": 60e9}


def duration_ns(text):
    m = re.match(r"\s*([0-9.]+)\s*(ns|µs|us|ms|s|min)\b", text)
    if not m:
        sys.exit("speedscope: cannot read a time from %r" % text)
    return float(m.group(1)) * UNITS[m.group(2)]


def sandwich_rows(text):
    """The Sandwich table as innerText gives it: after the header, each row
    is "TOTAL (P%)", "\\tSELF (P%)", "\\tNAME"."""
    _, _, table = text.partition("Total\tSelf\tSymbol Name\n")
    lines = [l.strip() for l in table.split("\n") if l.strip()]
    if len(lines) % 3:
        sys.exit("speedscope: a Sandwich table of %d lines: %r" % (len(lines), table))
    return [{"name": lines[i + 2], "total_ns": duration_ns(lines[i]),
             "self_ns": duration_ns(lines[i + 1])} for i in range(0, len(lines), 3)]


def speedscope(index, trace, shot):
    b = Browser()
    try:
        b.open("file://" + os.path.abspath(index))
        b.wait_for("document.readyState === 'complete'"
                   " && document.querySelector('input[type=file]') !== null", "speedscope's start page")
        # The node, by a JavaScript reference (DOM.getDocument's node ids
        # go stale when the app re-renders).
        obj = b.call("Runtime.evaluate",
                     {"expression": "document.querySelector('input[type=file]')"})["result"]["objectId"]
        b.call("DOM.setFileInputFiles", {"objectId": obj, "files": [os.path.abspath(trace)]})
        text = b.wait_for(
            "(() => { const t = document.body.innerText;"
            " return (t.includes('Sandwich') || /wrong|error|unrecognized/i.test(t)) ? t : null })()",
            "speedscope's import")
        if "Sandwich" not in text:
            print(json.dumps({"error": text}))
            return
        b.eval("[...document.querySelectorAll('*')].filter(e => e.textContent.includes('Sandwich')"
               " && e.textContent.length < 20).pop().click()")
        title_of = re.compile(r"^(.*\((\d+)/(\d+)\))$", re.M)
        profiles = []
        while True:
            text = b.wait_for(
                "(() => { const t = document.body.innerText;"
                " return /Symbol Name\\n\\S/.test(t) ? t : null })()", "the Sandwich view's rows")
            # The table fills in as it renders: read it once it holds still.
            while True:
                time.sleep(0.2)
                again = b.eval("document.body.innerText")
                if again == text:
                    break
                text = again
            m = title_of.search(text)
            if not m:
                sys.exit("speedscope: no profile title in %r" % text)
            index, count = int(m.group(2)), int(m.group(3))
            if index != len(profiles) + 1:
                sys.exit("speedscope: profile %d shown after %d" % (index, len(profiles)))
            profiles.append({"title": m.group(1), "rows": sandwich_rows(text)})
            if shot and index == 1:
                b.screenshot(shot)
            if index == count:
                break
            # speedscope's key for the next profile.
            b.eval("window.dispatchEvent(new KeyboardEvent('keypress', {key: 'n', code: 'KeyN'}))")
            b.wait_for("!document.body.innerText.includes('(%d/%d)')" % (index, count),
                       "speedscope's next profile")
        print(json.dumps({"profiles": profiles}))
    finally:
        b.close()


def svg(path, shot):
    b = Browser()
    try:
        b.open("file://" + os.path.abspath(path))
        # The new tab is about:blank (complete) until the file's document
        # replaces it: wait for the SVG itself.
        b.wait_for("document.readyState === 'complete' && document.documentElement !== null"
                   " && document.documentElement.localName === 'svg'", "the SVG's load")
        result = b.eval(
            "(() => { const svg = document.documentElement;"
            " const frames = [...document.querySelectorAll('g')]"
            "  .filter(g => g.querySelector(':scope > title') && g.querySelector(':scope > rect'))"
            "  .map(g => ({title: g.querySelector(':scope > title').textContent,"
            "              width: g.querySelector(':scope > rect').getBoundingClientRect().width}));"
            " return {width: svg.getBoundingClientRect().width, frames: frames}; })()")
        if shot:
            b.screenshot(shot)
        print(json.dumps(result))
    finally:
        b.close()


def main():
    args = sys.argv[1:]
    if len(args) in (3, 4) and args[0] == "speedscope":
        speedscope(args[1], args[2], args[3] if len(args) == 4 else None)
    elif len(args) in (2, 3) and args[0] == "svg":
        svg(args[1], args[2] if len(args) == 3 else None)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
