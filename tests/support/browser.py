"""A real headless browser for the dashboard's tests: Debian's Chromium driven through
its own chromedriver (selenium), and a screenshot's distinct colours counted by the
browser itself (a canvas), so that no image library is needed."""

from __future__ import annotations

import base64
import shutil
import time

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def has_chromium() -> bool:
    return shutil.which(CHROMIUM) is not None and shutil.which(CHROMEDRIVER) is not None


def headless_chromium(width: int = 1280, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


_COUNT_COLOURS = """
const [dataUrl, done] = arguments;
const image = new Image();
image.onload = () => {
  const canvas = document.createElement('canvas');
  canvas.width = image.width; canvas.height = image.height;
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  const pixels = context.getImageData(0, 0, image.width, image.height).data;
  const seen = new Set();
  for (let i = 0; i < pixels.length; i += 4) seen.add((pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]);
  done(seen.size);
};
image.onerror = () => done(-1);
image.src = dataUrl;
"""


def distinct_colours(driver, png: bytes) -> int:
    """Distinct RGB colours in `png`, counted in a blank tab of the same browser (no
    page's Content-Security-Policy applies there); the current page is left as it was."""
    current = driver.current_window_handle
    driver.switch_to.new_window("tab")
    try:
        driver.get("about:blank")
        return driver.execute_async_script(_COUNT_COLOURS, "data:image/png;base64," + base64.b64encode(png).decode())
    finally:
        driver.close()
        driver.switch_to.window(current)


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
