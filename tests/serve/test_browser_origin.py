#!/usr/bin/env python3
"""Cross-site requests from a real browser (issue 29): a page on another
origin posts JSON (fetch) and a form to `onebit serve`, in headless Chromium.

Usage: python3 tests/serve/test_browser_origin.py PAGE_PORT REFUSING_URL ALLOWING_URL
(crates/onebit/tests/serve.rs starts two servers on SmolLM2-135M-Instruct,
the second with `--cors-origin http://elsewhere.test:PAGE_PORT`, and runs
this; Chromium comes from scripts/browser-deps.sh, selenium from
scripts/python-deps.sh.)

The page is served by this script on 127.0.0.1:PAGE_PORT and opened as
http://elsewhere.test:PAGE_PORT (Chromium maps the name to 127.0.0.1), so its
origin is neither loopback nor the server's. Against the first server both
posts are refused (the fetch fails, the form's answer is the 403); against
the second they are served. Prints "N passed, M failed".
"""
import http.server
import shutil
import sys
import threading

import runner  # tests/serve/runner.py, beside this script
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

PAGE_PORT = int(sys.argv[1])
REFUSING, ALLOWING = sys.argv[2].rstrip("/"), sys.argv[3].rstrip("/")
PAGE = b"""<!doctype html><title>elsewhere</title>
<form id="f" method="POST" enctype="text/plain">
<input name='{"prompt": "What is the capital of France?", "stream": false, "options": {"num_predict": 4}, "x": "' value='"}'>
</form>
<script>
async function post(url) {
  try {
    const r = await fetch(url + "/api/generate", {method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({prompt: "What is the capital of France?", stream: false,
                            options: {num_predict: 4}})});
    return "status " + r.status + " " + (await r.text());
  } catch (e) {
    return "blocked " + e;
  }
}
</script>
"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *a):
        pass


pages = http.server.HTTPServer(("127.0.0.1", PAGE_PORT), Page)
threading.Thread(target=pages.serve_forever, daemon=True).start()
opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
          "--host-resolver-rules=MAP elsewhere.test 127.0.0.1"):
    opts.add_argument(a)
opts.binary_location = shutil.which("chromium")
driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
PAGE_URL = f"http://elsewhere.test:{PAGE_PORT}/"


def fetch_from_page(server):
    driver.get(PAGE_URL)
    return driver.execute_async_script(
        "const done = arguments[arguments.length - 1]; post(arguments[0]).then(done);", server)


def form_from_page(server):
    driver.get(PAGE_URL)
    driver.execute_script(
        "const f = document.getElementById('f'); f.action = arguments[0] + '/api/generate'; f.submit();", server)
    WebDriverWait(driver, 120).until(lambda d: d.current_url.startswith(server))
    return driver.find_element("tag name", "body").text


def test_a_page_elsewhere_is_refused():
    got = fetch_from_page(REFUSING)
    assert got.startswith("blocked"), got
    body = form_from_page(REFUSING)
    assert "refused" in body and "--cors-origin" in body, body


def test_a_cors_origin_page_is_served():
    got = fetch_from_page(ALLOWING)
    assert got.startswith("status 200") and '"response"' in got, got
    # The form's text/plain body is JSON once its one field is joined.
    body = form_from_page(ALLOWING)
    assert '"done":true' in body.replace(" ", ""), body


if __name__ == "__main__":
    try:
        driver.set_script_timeout(120)
        runner.run(globals())
    finally:
        driver.quit()
        pages.shutdown()
