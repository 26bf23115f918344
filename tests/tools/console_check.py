"""Drives a running projector's console (/console) in headless Chromium through Playwright, as
an operator would; prints one JSON object saying what it saw and did.

Usage: python console_check.py BASE_URL CHROMIUM SCREENSHOTS_DIR STEP [TOKEN]

STEP is one of:
  look     the overview (lag table and chart, halts, parked, dead letters) and the first dead
           letter's page; screenshots of both
  refused  discard the first dead letter with a wrong TOKEN: the refusal page
  discard  discard the first dead letter with TOKEN: the result page, then the overview again
  halt     the overview of a run with a halted partition and a parked aggregate, then skip
           its missing version with TOKEN: the result page, then the overview again
"""

import json
import os
import sys

from playwright.sync_api import sync_playwright

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def first_letter(page):
    row = page.locator("#dead-letters tr[data-id]").first
    return row, row.get_attribute("data-id")


def samples(page, base):
    """Waits for a few samples of lag (one every 5 s), then draws the page again."""
    for _ in range(40):
        if len(page.request.get(f"{base}/console/lag.json").json()["t"]) >= 3:
            break
        page.wait_for_timeout(500)
    page.reload()
    # The charts (offsets and seconds behind) draw from /console/lag.json.
    page.wait_for_selector("#lag-chart canvas", timeout=20000)
    page.wait_for_selector("#lag-seconds-chart canvas", timeout=20000)


def discard(page, token):
    row, letter = first_letter(page)
    form = row.locator("form[action$='/discard']")
    form.locator("input[name=reason]").fill("poison: the producer sent text for an amount")
    form.locator("input[name=token]").fill(token)
    form.locator("input[name=operator]").fill("console-test")
    form.locator("button").click()
    page.wait_for_load_state()
    return letter


def main():
    base, chromium, shots, step = sys.argv[1:5]
    token = sys.argv[5] if len(sys.argv) > 5 else ""
    os.makedirs(shots, exist_ok=True)
    seen = {"step": step}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/console")
        if step == "look":
            samples(page, base)
            seen["ready"] = page.inner_text("#ready")
            seen["lag_rows"] = page.locator("#lag tr").count() - 1
            seen["halts"] = page.inner_text("#halts")
            seen["parked"] = page.inner_text("#parked")
            seen["dead_letters"] = page.locator("#dead-letters tr[data-id]").count()
            page.screenshot(path=os.path.join(shots, "console-overview.png"), full_page=True)
            _, letter = first_letter(page)
            page.click(f"a[href='/console/dead-letters/{letter}']")
            page.wait_for_selector("#payload")
            seen["letter"] = letter
            seen["error"] = page.inner_text("#error")
            seen["payload"] = page.inner_text("#payload")
            page.screenshot(path=os.path.join(shots, "console-dead-letter.png"), full_page=True)
        elif step == "refused":
            seen["letter"] = discard(page, token)
            seen["result"] = page.inner_text("body")
        elif step == "discard":
            seen["letter"] = discard(page, token)
            seen["result"] = page.inner_text("#result")
            page.screenshot(path=os.path.join(shots, "console-discarded.png"), full_page=True)
            page.goto(f"{base}/console")
            seen["parked"] = page.inner_text("#parked")
            seen["dead_letters"] = page.locator("#dead-letters tr[data-id]").count()
        elif step == "halt":
            samples(page, base)
            seen["ready"] = page.inner_text("#ready")
            seen["halts"] = page.inner_text("#halts")
            seen["parked"] = page.inner_text("#parked")
            page.screenshot(path=os.path.join(shots, "console-halt.png"), full_page=True)
            form = page.locator("#parked form[action='/console/parked/skip']").first
            form.locator("input[name=reason]").fill("version 2 was never published")
            form.locator("input[name=token]").fill(token)
            form.locator("input[name=operator]").fill("console-test")
            form.locator("button").click()
            page.wait_for_load_state()
            seen["result"] = page.inner_text("#result")
            page.goto(f"{base}/console")
            seen["parked_after"] = page.inner_text("#parked")
        else:
            sys.exit(f"unknown step {step!r}")
        browser.close()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
