#!/usr/bin/env python3
"""The chat page at / in headless Chromium, driven by selenium.

Usage: python3 tests/serve/test_page.py http://127.0.0.1:PORT SHOTS KEY
(crates/onebit/tests/page.rs starts `onebit serve` on SmolLM2-135M-Instruct
and Qwen2.5-Coder-0.5B-Instruct with the API key KEY and runs this; Chromium
and its driver come from scripts/browser-deps.sh, selenium and markdown-it-py
from scripts/python-deps.sh.) Screenshots are saved as SHOTS + "chat.png",
"code.png", "reload.png" and "images.png", and their paths printed.

1. The renderer (the page's window.onebitRender test hook) against
   markdown-it-py, a CommonMark reference implementation (with GFM tables),
   on fixed markdown;
   and what model text must never become: scripts, images, unsafe links.
2. The model picker lists what /v1/models lists. SmolLM2, asked the capital
   of France (sent with Enter), streams an answer that says Paris; a long
   answer is cut by the Stop button.
3. A new conversation on Qwen2.5-Coder: "Write a Python function that returns
   the square of x." at temperature 0 answers with a ```python block, which
   the page shows as <pre><code> in a monospace font with a copy button that
   copies the code.
4. After a reload both conversations are listed and the code block is back.
   Regenerate with fewer tokens replaces the answer (the greedy answer
   shortened, not a second answer); editing the question and resending
   replaces question and answer; a deleted conversation stays deleted.
   An image attached with the Image button (the file input) and one pasted
   into the message box show as thumbnails, go out as image_url parts with
   data: URLs, stay in the user's bubble, and SmolLM2 (no vision tower)
   answers with the server's refusal naming it, shown as an error.
5. reasoning_content deltas (a stubbed stream) are folded in a <details>;
   stored conversations that cannot be read are said so and kept aside.
Exits 1 on failure; prints "page ok" at the end.
"""
import base64
import html.parser
import json
import os
import shutil
import sys
import urllib.request

from markdown_it import MarkdownIt
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

url, shots, key = sys.argv[1], sys.argv[2], sys.argv[3]

# Markdown the renderer must render as CommonMark does (compared after
# normalize() below). Each line is one rule of the spec or a shape models write.
CASES = [
    "one\ntwo\n\nthree",
    "hard  \nbreak and\\\nslash",
    "*em* and **strong** and ***both***",
    "_under_ __double__ snake_case_name 2*3*4",
    "**bold *nested em* bold**",
    "*not closed and ** stray",
    "a * b * c",
    "foo*bar*baz and foo_bar_baz",
    "**foo\"*bar*\"foo**",
    "*foo**bar**baz*", "**foo*", "*foo**", "_(x)_ and __a__b", "*a **b** c*", "***strong em*** end",
    "use `x < y && z` here, ``a ` b`` too, `` `tick` ``",
    "unclosed `code here",
    "\\*not em\\* \\# \\[x\\] &amp; &lt;b&gt; &#65;&#x42;",
    "<b>bold?</b> <script>alert(1)</script>",
    "see [the docs](https://example.com/a_b?x=1&y=2) and [t](https://e.com \"Title\")",
    "autolink <https://example.com/x> and mail <me@example.com>",
    "[*em text*](https://e.com) and [no link] and [x]( https://e.com/(p) )",
    "[a [nested] b](https://e.com) and [d](<https://e.com/a b>)",
    "[caf\u00e9](https://e.com/caf\u00e9) [p](https://e.com/100%25) [q](https://e.com/a%zz)",
    "# One\n## Two ##\n###### Six\n#not heading",
    "Setext one\n===\n\nSetext two\n---",
    "a\n\n---\n\n* * *\n___",
    "- one\n- two\n- three",
    "* a\n* b\n\n* c",
    "1. first\n2. second\n3. third",
    "3. three\n4. four",
    "1) paren\n2) style",
    "- a\n  - nested\n  - more\n- b",
    "1. **Step one**: do\n   - detail `x`\n2. Step two\n\n   with a paragraph",
    "- item\nlazy line\n- next",
    "- a\n+ b",
    "Text\n- list right after\n- b",
    "The number is\n14. not a list",
    "> quoted *text*\n> more\nlazy\n\n> second",
    "> # head\n> - item",
    "```python\ndef square(x):\n    return x * x\n```",
    "~~~\nno lang <tag> & stuff\n~~~",
    "````\n```\ninner fence\n```\n````",
    "```js\nunclosed fence\nstill code",
    "    indented code\n    more\n\nafter",
    "- list\n\n  ```sh\n  echo hi\n  ```",
    "Here:\n```python\nprint(1)\n```\nDone.",
    "| a | b |\n| --- | --- |\n| 1 | `x|` |\n| 2 |",
    "Name | Left | Mid | Right\n:--- | :- | :-: | --:\n*x* | y | z | w | extra\n\nafter",
    "Text before\n| h |\n| - |\n| \\| pipe |",
    "| only head |\n|---|", "| a | b |\n| --- |\n| not | a table |",
    "a | b\n--- | ---\nno trailing blank\n> quote ends it",
    "Here's a simple Python function:\n\n```python\ndef square(x):\n    return x * x\n```\n\n"
    "This function takes a single argument `x` and returns its **square**. For example:\n\n"
    "1. `square(2)` is 4\n2. `square(3)` is 9",
]


class Tree(html.parser.HTMLParser):
    """HTML -> (tag, attributes, children), the attributes CommonMark sets only."""

    VOID = ("br", "hr", "img")

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = ["root", {}, []]
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        keep = {k: v for k, v in attrs if k in ("href", "start", "title", "src", "alt")
                or (k == "class" and tag == "code")}
        if "style" in dict(attrs):  # "text-align: center;" and "text-align:center" alike
            keep["style"] = dict(attrs)["style"].replace(" ", "").rstrip(";")
        node = [tag, keep, []]
        self.stack[-1][2].append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        if tag not in self.VOID:
            assert self.stack.pop()[0] == tag, f"unbalanced </{tag}>"

    def handle_data(self, data):
        kids = self.stack[-1][2]
        if kids and isinstance(kids[-1], str):
            kids[-1] += data
        else:
            kids.append(data)


def normalize(html_text):
    """A comparable tree. Line ends between blocks and after <br> are layout
    whitespace in HTML (markdown-it writes them; the page, whose text keeps
    its line ends with white-space: pre-wrap, leaves them out)."""
    t = Tree()
    t.feed(html_text)
    t.close()

    def walk(node):
        tag, attrs, kids = node
        out = []
        for k in kids:
            if isinstance(k, str):
                if tag in ("root", "ul", "ol", "li", "blockquote", "table", "thead", "tbody", "tr"):
                    k = k.strip("\n")
                if out and out[-1][0] == "br":
                    k = k.lstrip("\n")
                if k:
                    out.append(k)
            else:
                out.append(walk(k))
        return (tag, tuple(sorted(attrs.items())), tuple(out))

    return walk(t.root)


def tags(tree):
    found = set()

    def walk(n):
        if isinstance(n, tuple):
            found.add(n[0])
            for k in n[2]:
                walk(k)

    walk(tree)
    return found


def check_renderer(driver):
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    render = lambda text: driver.execute_script("return window.onebitRender(arguments[0])", text)
    bad = []
    for case in CASES:
        ours, ref = render(case), md.render(case)
        if normalize(ours) != normalize(ref):
            bad.append(f"{case!r}\n  page:        {ours!r}\n  markdown-it: {ref!r}")
    assert not bad, "the renderer differs from CommonMark:\n" + "\n".join(bad)
    # Safety: model text never becomes markup or a script link.
    hostile = render("<script>alert(1)</script> <img src=x onerror=alert(1)> <a href='javascript:x'>a</a>\n\n"
                     "[js](javascript:alert(1)) [data](data:text/html,<b>x</b>) <javascript:alert(1)> "
                     "[vb](vbscript:x) ![pic](https://example.com/p.png)")
    found = tags(normalize(hostile))
    assert not found & {"script", "img"}, hostile
    links = driver.execute_script(
        "const d = document.createElement('div'); d.innerHTML = window.onebitRender(arguments[0]);"
        "return [...d.querySelectorAll('a')].map(a => [a.getAttribute('href'), a.rel, a.target]);",
        "[js](javascript:alert(1)) [data](data:text/html,x) <javascript:alert(1)> [ok](https://example.com/) "
        "![pic](https://example.com/p.png)")
    assert links == [["https://example.com/", "noopener noreferrer", "_blank"],
                     ["https://example.com/p.png", "noopener noreferrer", "_blank"]], links
    assert "&lt;script&gt;" in hostile, hostile
    print(f"renderer: {len(CASES)} cases as markdown-it-py renders them; scripts, images and unsafe links stay text")


def until(driver, test, timeout=30):
    """Waits for test(driver); an element the page redrew meanwhile is looked up again."""
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(test)


def server_models():
    req = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer " + key})
    with urllib.request.urlopen(req) as r:
        return [m["id"] for m in json.load(r)["data"]]


def stored_chats(driver):
    return json.loads(driver.execute_script("return localStorage.getItem('onebit-chats')") or "[]")


def current_chat(driver):
    cur = driver.execute_script("return localStorage.getItem('onebit-current')")
    return next(c for c in stored_chats(driver) if c["id"] == cur)


def load(driver):
    """Opens or reloads the page and waits until it has drawn the stored
    conversation with the server's models in the picker."""
    driver.get(url + "/")
    until(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))


def set_field(driver, id_, value):
    f = driver.find_element(By.ID, id_)
    f.clear()
    f.send_keys(value)


def pick_model(driver, name):
    until(driver, lambda d: name in [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#model option")])
    driver.find_element(By.CSS_SELECTOR, f"#model option[value='{name}']").click()


def answers(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def wait_done(driver, count):
    """Waits for `count` assistant messages, the last one finished."""
    until(driver,
        lambda d: len(answers(d)) == count and answers(d)[-1].get_attribute("data-state") == "done"
        and not d.find_element(By.ID, "send").get_attribute("disabled"), 180)
    errors = driver.find_elements(By.CSS_SELECTOR, ".msg.error")
    assert not errors, [e.text for e in errors]
    return answers(driver)[-1]


SQUARE = "Write a Python function that returns the square of x."
CUBE = "Write a Python function that returns the cube of x."

opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,760"):
    opts.add_argument(a)
opts.binary_location = shutil.which("chromium")
driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
try:
    load(driver)
    assert driver.title == "onebit chat", driver.title
    check_renderer(driver)

    # 2. The picker, SmolLM2, Paris, Stop.
    driver.find_element(By.ID, "key").send_keys(key, Keys.TAB)  # change -> the models load with the key
    models = server_models()
    assert len(models) == 2, models
    smol, qwen = (next(m for m in models if s in m.lower()) for s in ("smollm2", "qwen"))
    until(driver, lambda d: [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#model option")] == models)
    pick_model(driver, smol)
    driver.find_element(By.ID, "system").send_keys("You are a helpful assistant.")
    set_field(driver, "max", "24")
    set_field(driver, "temp", "0")
    prompt = driver.find_element(By.ID, "prompt")
    prompt.send_keys("line one", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "line two")
    assert prompt.get_attribute("value") == "line one\nline two", repr(prompt.get_attribute("value"))
    assert not answers(driver), "Shift+Enter sent the message"
    prompt.clear()
    prompt.send_keys("What is the capital of France?", Keys.ENTER)
    box = wait_done(driver, 1)
    answer = box.find_element(By.CSS_SELECTOR, ".content").text
    assert "Paris" in answer, answer
    stats = driver.find_element(By.ID, "stats").text
    assert "tok/s" in stats and stats.startswith(smol), stats
    assert driver.find_element(By.ID, "stop").get_attribute("disabled"), "stop stays enabled after the answer"
    driver.save_screenshot(shots + "chat.png")
    print(f"answer: {answer!r}\nstats: {stats!r}\nscreenshot: {shots}chat.png")

    set_field(driver, "max", "400")
    driver.find_element(By.ID, "prompt").send_keys("Write a long story about a dragon.")
    driver.find_element(By.ID, "send").click()
    until(driver, lambda d: len(answers(d)) == 2 and answers(d)[1].find_element(By.CSS_SELECTOR, ".content").text.strip(), 120)
    driver.find_element(By.ID, "stop").click()
    meta = wait_done(driver, 2).find_element(By.CSS_SELECTOR, ".meta").text
    assert "(stopped)" in meta, meta
    print(f"stopped: {meta!r}")

    # 3. A new conversation on Qwen2.5-Coder: a fenced code block.
    driver.find_element(By.ID, "new").click()
    assert not answers(driver) and driver.find_element(By.ID, "system").get_attribute("value") == "You are a helpful assistant."
    pick_model(driver, qwen)
    set_field(driver, "max", "40")
    driver.find_element(By.ID, "prompt").send_keys(SQUARE)
    driver.find_element(By.ID, "send").click()
    box = wait_done(driver, 1)
    assert box.find_element(By.CSS_SELECTOR, ".meta").text.startswith(qwen)
    codes = box.find_elements(By.CSS_SELECTOR, ".content pre > code")
    assert codes, box.get_attribute("innerHTML")
    code = codes[0]
    assert code.get_attribute("class") == "language-python", code.get_attribute("class")
    assert "def square(x):" in code.text and "return" in code.text, code.text
    assert "```" not in box.find_element(By.CSS_SELECTOR, ".content").text
    font = driver.execute_script("return getComputedStyle(arguments[0]).fontFamily", code)
    assert "monospace" in font, font
    driver.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    copy = box.find_element(By.CSS_SELECTOR, ".codeblock .copy")
    copy.click()
    until(driver, lambda d: copy.text == "Copied", 10)
    clip = driver.execute_async_script("navigator.clipboard.readText().then(arguments[0], e => arguments[0]('error: ' + e))")
    stored = current_chat(driver)["messages"][1]["content"]
    fenced = stored.split("```python\n", 1)[1].split("```", 1)[0].rstrip("\n")
    assert clip == fenced, (clip, fenced)
    driver.save_screenshot(shots + "code.png")
    print(f"code block: {code.text!r} (font {font}); copied {clip!r}\nscreenshot: {shots}code.png")

    # 4. Reload: both conversations listed, the code block back.
    load(driver)
    titles = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#chats li .open")]
    assert titles == [SQUARE, "What is the capital of France?"], titles
    box = wait_done(driver, 1)
    assert "def square(x):" in box.find_element(By.CSS_SELECTOR, ".content pre > code").text
    assert driver.find_element(By.ID, "model").get_attribute("value") == qwen
    assert [driver.find_element(By.ID, f).get_attribute("value") for f in ("max", "temp")] == ["40", "0"]
    driver.save_screenshot(shots + "reload.png")
    print(f"after reload: {titles}\nscreenshot: {shots}reload.png")
    driver.find_element(By.CSS_SELECTOR, "#chats li:nth-child(2) .open").click()
    assert "Paris" in answers(driver)[0].text and len(answers(driver)) == 2
    assert driver.find_element(By.ID, "model").get_attribute("value") == smol
    driver.find_element(By.CSS_SELECTOR, "#chats li:nth-child(1) .open").click()
    assert driver.find_element(By.ID, "model").get_attribute("value") == qwen

    # Regenerate with 12 tokens: the greedy answer again, cut shorter, in place of the first.
    before = current_chat(driver)["messages"][1]["content"]
    set_field(driver, "max", "12")
    answers(driver)[0].find_element(By.CSS_SELECTOR, ".regen").click()
    box = wait_done(driver, 1)
    msgs = current_chat(driver)["messages"]
    after = msgs[1]["content"]
    assert [m["role"] for m in msgs] == ["user", "assistant"], msgs
    assert after != before and before.startswith(after), (before, after)
    assert "(length)" in box.find_element(By.CSS_SELECTOR, ".meta").text
    print(f"regenerated: {after!r}")

    # Edit the question and resend: question and answer replaced.
    driver.find_element(By.CSS_SELECTOR, ".msg.user .edit").click()
    ta = driver.find_element(By.CSS_SELECTOR, ".msg.user .editing textarea")
    ta.clear()
    set_field(driver, "max", "40")
    ta.send_keys(CUBE, Keys.ENTER)
    box = wait_done(driver, 1)
    msgs = current_chat(driver)["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[0]["content"] == CUBE, msgs
    assert "def cube(x):" in box.find_element(By.CSS_SELECTOR, ".content pre > code").text, msgs[1]
    assert driver.find_element(By.CSS_SELECTOR, ".msg.user .content").text == CUBE
    assert driver.find_element(By.CSS_SELECTOR, "#chats li.current .open").text == CUBE
    print(f"edited and resent: {msgs[1]['content']!r}")

    # Delete the Paris conversation; after a reload it stays deleted.
    driver.find_element(By.CSS_SELECTOR, "#chats li:nth-child(2) .del").click()
    load(driver)
    titles = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "#chats li .open")]
    assert titles == [CUBE], titles

    # Images: one attached with the file input, one pasted; SmolLM2 has no
    # vision tower, so the server's refusal is the answer shown.
    photo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "testdata", "images", "chelsea.png")
    driver.find_element(By.ID, "new").click()
    pick_model(driver, smol)
    picker = driver.find_element(By.ID, "file")
    driver.execute_script("arguments[0].hidden = false", picker)
    picker.send_keys(os.path.abspath(photo))
    with open(photo, "rb") as f:
        b64 = base64.b64encode(f.read()).decode()
    driver.execute_script("""
      const bin = atob(arguments[0]), u = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
      const dt = new DataTransfer();
      dt.items.add(new File([u], 'pasted.png', {type: 'image/png'}));
      document.getElementById('prompt').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true}));
    """, b64)
    until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#pending img")) == 2)
    driver.find_element(By.ID, "prompt").send_keys("What is in this picture?", Keys.ENTER)
    until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.error"), 60)
    error = driver.find_element(By.CSS_SELECTOR, ".msg.error").text
    assert "has no vision tower" in error and "SmolLM2" in error, error
    shown = driver.find_elements(By.CSS_SELECTOR, ".msg.user .thumbs img")
    assert len(shown) == 2 and all(i.get_attribute("src").startswith("data:image/png;base64,") for i in shown), shown
    assert not driver.find_elements(By.CSS_SELECTOR, "#pending img"), "the attachments stay pending after sending"
    assert not answers(driver), "an answer appeared for a refused image"
    driver.save_screenshot(shots + "images.png")
    print(f"images: {error!r}\nscreenshot: {shots}images.png")

    # 5. reasoning_content folded: a stubbed stream in the shape the server sends.
    driver.execute_script("""
      const real = window.fetch;
      window.fetch = (u, o) => {
        if (u !== '/v1/chat/completions') return real(u, o);
        const ev = (d) => 'data: ' + JSON.stringify({choices: [{index: 0, delta: d, finish_reason: null}]}) + '\\n\\n';
        const body = ev({role: 'assistant'}) + ev({reasoning_content: 'The user wants '}) + ev({reasoning_content: 'a greeting.'})
          + ev({content: 'Hello *there*'}) + 'data: [DONE]\\n\\n';
        return Promise.resolve(new Response(body, {headers: {'Content-Type': 'text/event-stream'}}));
      };""")
    driver.find_element(By.ID, "new").click()
    driver.find_element(By.ID, "prompt").send_keys("Say hello.", Keys.ENTER)
    box = wait_done(driver, 1)
    fold = box.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert fold.is_displayed() and not fold.get_attribute("open"), "the reasoning is not folded"
    assert driver.execute_script("return arguments[0].querySelector('.think').textContent", fold) == "The user wants a greeting."
    content = box.find_element(By.CSS_SELECTOR, ".content")
    assert content.text == "Hello there" and content.find_element(By.TAG_NAME, "em").text == "there", content.text
    fold.find_element(By.TAG_NAME, "summary").click()
    assert "a greeting." in fold.text
    print("reasoning folded")

    # Stored conversations that cannot be read are said so and kept aside.
    driver.execute_script("localStorage.setItem('onebit-chats', '{broken')")
    load(driver)
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg.error")]
    assert len(errors) == 1 and "could not all be read" in errors[0], errors
    assert driver.execute_script("return localStorage.getItem('onebit-chats-unreadable')") == "{broken"
    print(f"unreadable storage: {errors[0]!r}")
    print("page ok")
finally:
    driver.quit()
