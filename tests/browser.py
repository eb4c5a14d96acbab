"""A real browser for the end-to-end tests of the pages (issue 38): the distribution's headless Chromium
driven by Selenium through its chromedriver (both installed by scripts/browser.sh).  ``chrome()`` opens one
with a fresh profile under ``tmp``; ``wait_for(driver, css, timeout)`` returns the first element ``css``
names once it is shown (a bounded wait, never a fixed sleep); ``text_when(driver, css, predicate, timeout)``
its text once ``predicate`` holds for it."""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def binaries() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert browser and driver, ("Chromium is missing: scripts/browser.sh installs it "
                                "(chromium, chromium-driver)")
    return browser, driver


@contextmanager
def chrome(tmp: Path, width: int = 1280, height: int = 900) -> Iterator[webdriver.Chrome]:
    browser, driver_path = binaries()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-extensions", f"--window-size={width},{height}",
                f"--user-data-dir={tmp / 'chrome-profile'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, css: str, timeout: float = 20):
    return WebDriverWait(driver, timeout).until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))


def text_when(driver, css: str, predicate: Callable[[str], bool], timeout: float = 20) -> str:
    def ready(d):
        found = d.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found and predicate(found[0].text) else False
    return WebDriverWait(driver, timeout).until(ready)
