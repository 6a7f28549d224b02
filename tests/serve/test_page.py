#!/usr/bin/env python3
"""The chat page at / in headless Chromium, driven by selenium.

Usage: python3 tests/serve/test_page.py http://127.0.0.1:PORT SCREENSHOT.png KEY
(crates/onebit/tests/page.rs starts `onebit serve` on SmolLM2-135M-Instruct
with the API key KEY and runs this; Chromium and its driver come from
scripts/browser-deps.sh, selenium from scripts/python-deps.sh.)

Types the key, a system prompt and one question, waits for the streamed
answer to contain "Paris" and for the stream to end, checks the tokens/s
line, and saves a screenshot; then starts a long answer and stops it with the
Stop button. Exits 1 on failure.
"""
import shutil
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

url, shot, key = sys.argv[1], sys.argv[2], sys.argv[3]
opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,700"):
    opts.add_argument(a)
opts.binary_location = shutil.which("chromium")
driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
try:
    driver.get(url + "/")
    assert driver.title == "onebit chat", driver.title
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "system").send_keys("You are a helpful assistant.")
    mx = driver.find_element(By.ID, "max")
    mx.clear()
    mx.send_keys("24")
    t = driver.find_element(By.ID, "temp")
    t.clear()
    t.send_keys("0")
    driver.find_element(By.ID, "prompt").send_keys("What is the capital of France?")
    driver.find_element(By.ID, "send").click()
    wait = WebDriverWait(driver, 120)
    wait.until(lambda d: "Paris" in d.find_element(By.CSS_SELECTOR, ".msg.assistant .content").text)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, ".msg.assistant").get_attribute("data-state") == "done")
    answer = driver.find_element(By.CSS_SELECTOR, ".msg.assistant .content").text
    stats = driver.find_element(By.ID, "stats").text
    errors = driver.find_elements(By.CSS_SELECTOR, ".msg.error")
    assert not errors, [e.text for e in errors]
    assert "tok/s" in stats, stats
    assert driver.find_element(By.ID, "stop").get_attribute("disabled"), "stop stays enabled after the answer"
    driver.save_screenshot(shot)
    print(f"answer: {answer!r}\nstats: {stats!r}\nscreenshot: {shot}")

    # Stop: a long answer is cut as soon as it starts; the page says so and
    # takes the next message.
    mx.clear()
    mx.send_keys("400")
    driver.find_element(By.ID, "prompt").send_keys("Write a long story about a dragon.")
    driver.find_element(By.ID, "send").click()
    second = lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1]
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
               and second(d).find_element(By.CSS_SELECTOR, ".content").text.strip())
    driver.find_element(By.ID, "stop").click()
    wait.until(lambda d: second(d).get_attribute("data-state") == "done")
    meta = second(driver).find_element(By.CSS_SELECTOR, ".meta").text
    assert "(stopped)" in meta, meta
    assert not driver.find_element(By.ID, "send").get_attribute("disabled")
    print(f"stopped: {meta!r}")
    print("page ok")
finally:
    driver.quit()
