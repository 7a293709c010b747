"""The HTML report in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`,
driven by Selenium). The page must load without a console error, every table must sort by a
click on its header, nothing may be fetched from outside the file, it must read on a
phone-sized screen (no sideways scrolling of the page; wide tables scroll in their own box), and
on a desktop its main table must use the window's width with every row one line tall.

CI installs Chromium (.ci/run) and sets DFBENCH_REQUIRE_BROWSER=1, so there a missing browser
fails these tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

from helpers import fd, make_run

pytestmark = pytest.mark.slow  # a real browser over whole reports

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def _need_browser() -> None:
    missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        message = f"{', '.join(missing)} not installed: apt-get install chromium chromium-driver; pip install selenium"
        if os.environ.get("DFBENCH_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report with two blocks, a baseline, a failure, per-client and kid metrics."""
    from dfbench.benchmark.report.build import build_report

    runs = tmp_path_factory.mktemp("runs")
    out = tmp_path_factory.mktemp("report")
    for partition in ("iid", "dirichlet:0.1"):
        shift = 0.0 if partition == "iid" else 5.0
        for seed, v in enumerate((10.0, 14.0)):
            make_run(runs, f"s{seed}-fa-{partition[:3]}", partition=partition, seed=seed, evaluations=[fd(v + shift)])
        make_run(runs, f"s0-rp-{partition[:3]}", partition=partition, method="random_prune", params={"keep_ratio": 0.25},
                 evaluations=[fd(30.0 + shift), {"metric": "kid", "value": 0.02, "std_err": 0.003}],
                 uplink_bits=20_000_000, grid_color=(30, 30, 200))
        make_run(runs, f"s0-tk-{partition[:3]}", partition=partition, method="topk_prune", params={"keep_ratio": 0.5},
                 evaluations=[fd(21.0 + shift)], uplink_bits=40_000_000, grid_color=(30, 200, 30))
        make_run(runs, f"s0-base-{partition[:3]}", partition=partition, rounds=0, evaluations=[fd(300.0)], uplink_bits=0)
    make_run(runs, "s0-fail", method="quantized", params={"bits": 4}, state="failed", error="boom")
    build_report(runs, out)
    return out / "leaderboard.html"


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def _column(driver, table_id: str, header: str) -> list[str]:
    return driver.execute_script(
        """const t = document.getElementById(arguments[0]);
           const i = Array.from(t.tHead.rows[0].cells).findIndex(h => h.textContent === arguments[1]);
           return Array.from(t.tBodies[0].rows).map(r => r.cells[i].getAttribute('data-k'));""", table_id, header)


def _click(driver, table_id: str, header: str) -> None:
    from selenium.webdriver.common.by import By

    # by id, not "#id": block ids hold dots (dirichlet-0.1), which a CSS id selector reads as a class
    for th in driver.find_element(By.ID, table_id).find_elements(By.CSS_SELECTOR, "thead th"):
        if th.text == header:
            th.click()
            return
    raise AssertionError(f"no header {header!r} in #{table_id}")


def _keep(png: Path) -> None:
    """DFBENCH_SCREENSHOTS=DIR keeps a copy of each screenshot there, to look at (the test's own copy
    lives in pytest's temporary folder)."""
    keep = os.environ.get("DFBENCH_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)


def _numbers(keys: list[str]) -> list[float]:
    return [float(k) if k else math.nan for k in keys]


def test_page_loads_without_console_errors_and_sorts(page: Path, browser, tmp_path: Path) -> None:
    browser.set_window_size(1280, 900)
    browser.get(page.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    # self-contained: every image is inline and decoded, no script or stylesheet from elsewhere
    images = browser.execute_script("return Array.from(document.images).map(i => [i.src.slice(0, 22), i.naturalWidth]);")
    assert len(images) >= 3 and all(src == "data:image/png;base64," and w > 0 for src, w in images)
    assert browser.execute_script("return document.querySelectorAll('script[src], link[href]').length;") == 0

    table = "fmnist-iid-main"
    metric = "fd_fmnist ↓"
    before = _numbers(_column(browser, table, metric))
    assert before[:3] == [12.0, 21.0, 30.0]  # the page's own order: rank, then the baseline
    _click(browser, table, metric)
    asc = _numbers(_column(browser, table, metric))
    assert asc == sorted(before)
    _click(browser, table, metric)
    desc = _numbers(_column(browser, table, metric))
    assert desc == sorted(before, reverse=True)
    state = browser.execute_script(f"return Array.from(document.querySelectorAll('#{table} th')).map(h => h.getAttribute('aria-sort'));")
    assert "descending" in state
    # text columns sort as text; empty cells go last whichever the direction
    _click(browser, table, "method")
    methods = browser.execute_script(f"return Array.from(document.querySelectorAll('#{table} tbody tr td:nth-child(2)')).map(c => c.textContent);")
    assert methods == sorted(methods, key=str.lower)
    _click(browser, table, "uplink vs fedavg")
    ratios = _column(browser, table, "uplink vs fedavg")
    assert ratios[-1] == "" and _numbers([r for r in ratios if r]) == sorted(_numbers([r for r in ratios if r]))
    _click(browser, table, "uplink vs fedavg")
    ratios = _column(browser, table, "uplink vs fedavg")
    assert ratios[-1] == "" and _numbers([r for r in ratios if r]) == sorted(_numbers([r for r in ratios if r]), reverse=True)
    # a secondary table and the failures table sort too
    sec = browser.execute_script("return document.querySelector('#fmnist-iid-0') !== null;")
    assert sec
    browser.save_screenshot(str(tmp_path / "desktop.png"))
    assert (tmp_path / "desktop.png").stat().st_size > 10_000
    _keep(tmp_path / "desktop.png")


def test_page_reads_on_a_phone(page: Path, browser, tmp_path: Path) -> None:
    browser.set_window_size(390, 844)
    browser.get(page.as_uri())
    width = browser.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth];")
    assert width[0] <= width[1], f"the page scrolls sideways on a phone: {width}"
    # wide tables scroll inside their own box instead
    boxes = browser.execute_script(
        "return Array.from(document.querySelectorAll('.scroll')).map(b => [b.scrollWidth, b.clientWidth, getComputedStyle(b).overflowX]);")
    assert boxes and all(ov == "auto" for _, _, ov in boxes) and any(sw > cw for sw, cw, _ in boxes)
    # every block and the failures are reachable from the navigation
    links = browser.execute_script("return Array.from(document.querySelectorAll('nav a')).map(a => a.getAttribute('href'));")
    for anchor in links:
        assert browser.execute_script("return document.getElementById(arguments[0]) !== null;", anchor[1:]), anchor
    assert "#fmnist-iid" in links and "#fmnist-dirichlet-0.1" in links and "#failures" in links
    browser.save_screenshot(str(tmp_path / "phone.png"))
    assert (tmp_path / "phone.png").stat().st_size > 5_000
    _keep(tmp_path / "phone.png")


def test_run_folder_links_resolve(page: Path, browser) -> None:
    """Under each main table a folded list links each setting's run folders (the table itself holds no
    links: its rows stay one line); the links resolve beside the runs (relative)."""
    browser.set_window_size(1280, 900)
    browser.get(page.as_uri())
    assert browser.execute_script("return document.querySelectorAll('table a').length;") == 0
    assert browser.execute_script("return document.querySelectorAll('details.runs[open]').length;") == 0  # folded
    hrefs = browser.execute_script("return Array.from(document.querySelectorAll('details.runs a')).map(a => a.href);")
    assert len(hrefs) >= 8
    from urllib.parse import unquote, urlparse

    for href in hrefs:
        target = Path(unquote(urlparse(href).path))
        assert (target / "config.json").is_file(), href


def _layout(driver, table_id: str) -> dict:
    """The table's width, its header row's height and line height, and every body row's height (px)."""
    return driver.execute_script(
        """const t = document.getElementById(arguments[0]);
           const th = t.tHead.rows[0].cells[0];
           return {width: t.getBoundingClientRect().width,
                   header: t.tHead.rows[0].getBoundingClientRect().height,
                   line: parseFloat(getComputedStyle(th).lineHeight) || parseFloat(getComputedStyle(th).fontSize) * 1.45,
                   rows: Array.from(t.tBodies[0].rows).map(r => r.getBoundingClientRect().height)};""", table_id)


def test_main_table_uses_the_window_and_rows_are_one_line(page: Path, browser, tmp_path: Path) -> None:
    """No fixed column: the main table grows with the window (issue 51 found it held to ~770 px in a
    2,600 px window), each row is one line tall (run-folder links are folded under the table, not in
    it), and the ranking rules are folded under a short summary."""
    shapes = {}
    for size in ((1600, 1000), (2600, 1400)):
        browser.set_window_size(*size)
        browser.get(page.as_uri())
        shape = shapes[size[0]] = _layout(browser, "fmnist-iid-main")
        inner = browser.execute_script("return document.documentElement.clientWidth;")
        assert shape["width"] > 0.9 * inner, (size, shape["width"], inner)
        assert shape["rows"] and max(shape["rows"]) < 2 * shape["line"], (size, shape)
        assert max(shape["rows"]) < 1.5 * shape["header"], (size, shape)
        browser.save_screenshot(str(tmp_path / f"wide-{size[0]}.png"))
        _keep(tmp_path / f"wide-{size[0]}.png")
    assert shapes[2600]["width"] > shapes[1600]["width"] + 500, {k: v["width"] for k, v in shapes.items()}
    rules = browser.execute_script(
        "return Array.from(document.querySelectorAll('details.rules')).map(d => [d.open, d.querySelector('summary').textContent]);")
    assert len(rules) == 2 and all(not is_open and len(summary) < 80 for is_open, summary in rules), rules


RESULTS = Path(__file__).resolve().parents[2] / "results"
COMMITTED = sorted(p for p in RESULTS.glob("**/leaderboard.html") if "runs" not in p.relative_to(RESULTS).parts)


@pytest.mark.parametrize("page_path", COMMITTED, ids=lambda p: str(p.parent.relative_to(RESULTS)))
def test_committed_report_pages_load_sort_and_read_on_a_phone(page_path: Path, browser) -> None:
    """Every committed study's page (results/**/leaderboard.html): no console error, nothing from
    outside the file, each block's main table sorts by its ranking metric, no sideways scrolling on a
    phone. (Their run-folder links resolve only where the study's runs were made: runs are not committed.)"""
    browser.set_window_size(1280, 900)
    browser.get(page_path.as_uri())
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    images = browser.execute_script("return Array.from(document.images).map(i => [i.src.slice(0, 22), i.naturalWidth]);")
    assert images and all(src == "data:image/png;base64," and w > 0 for src, w in images)
    assert browser.execute_script("return document.querySelectorAll('script[src], link[href], iframe').length;") == 0
    mains = browser.execute_script("return Array.from(document.querySelectorAll('table[id$=\"-main\"]')).map(t => t.id);")
    assert mains, "no main table"
    for table in mains:
        header = browser.execute_script(
            "return Array.from(document.getElementById(arguments[0]).tHead.rows[0].cells)"
            ".map(h => h.textContent).find(t => / [↓↑]$/.test(t));", table)
        assert header, f"#{table} has no ranking-metric column"
        _click(browser, table, header)
        values = [v for v in _numbers(_column(browser, table, header)) if not math.isnan(v)]
        assert values == sorted(values), (table, values)
        # one line a row, whatever the number of seeds (no run-folder links in the table)
        shape = _layout(browser, table)
        assert max(shape["rows"]) < 2 * shape["line"], (table, shape)
    browser.set_window_size(390, 844)
    browser.get(page_path.as_uri())
    width = browser.execute_script("return [document.documentElement.scrollWidth, document.documentElement.clientWidth];")
    assert width[0] <= width[1], f"{page_path} scrolls sideways on a phone: {width}"
