"""Headless Chromium for the browser tests (the book, the formgrader, the class server): one place
for its flags and for the message when it is missing.

    from browser import chrome, served
    driver = chrome(width=1280, height=2000)   # selenium's webdriver.Chrome; quit() it when done
    with served(ROOT / "_build" / "html") as url:   # the built book over HTTP on 127.0.0.1
        driver.get(f"{url}/index.html")
"""
from __future__ import annotations

import contextlib
import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# the flags the developers' guide gives for these machines, and a shared-memory-free renderer
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chrome(width: int = 1280, height: int = 900, page_load_timeout: float = 60):
    """A headless Chromium driven by chromedriver (both Debian packages: `make system`)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        pytest.fail("chromium and chromedriver are needed (Debian: apt-get install chromium "
                    "chromium-driver, or `make system`)", pytrace=False)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--window-size={width},{height}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(page_load_timeout)
    driver.set_script_timeout(page_load_timeout)
    return driver


@contextlib.contextmanager
def served(html: Path):
    """The folder ``html`` (the built book) over HTTP on 127.0.0.1, a free port; yields its URL."""
    if not (html / "index.html").exists():
        pytest.fail(f"{html} is missing: build the book first with `make book`", pytrace=False)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
