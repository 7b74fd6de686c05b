"""The store browser in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``; ``bin/setup`` installs them where it can) driven by Selenium, against the real
``memory-http`` server.  Search, open a record, pin it, forget it with a reason, the health page,
with the keyboard where a person would use it.  Screenshots of the main pages are saved under the
test run's tmp folder (``$NUBOS_MEMORY_SCREENSHOTS`` to keep them elsewhere; ``docs/browser.png``
is one of them).  Skipped, with the reason, only where Chromium or its driver cannot be had."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nubos_memory import Memory

from .conftest import rec, write_config
from .test_http import Served, serve

pytestmark = pytest.mark.browser

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
DRIVER = ("chromedriver",)


def _found(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return next((p for p in extra if os.path.exists(p)), None)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[test]')")
    from selenium.common.exceptions import WebDriverException

    binary = _found(CHROMIUM)
    chromedriver = _found(DRIVER, ("/usr/lib/chromium/chromedriver",))
    if binary is None or chromedriver is None:
        pytest.skip("Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1366,900", "--lang=en-US"):
        options.add_argument(arg)
    try:
        browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=chromedriver))
    except WebDriverException as exc:
        pytest.skip(f"Chromium cannot start here: {str(exc).splitlines()[0][:200]}")
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


@pytest.fixture
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("NUBOS_MEMORY_SCREENSHOTS")
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        return Path(given)
    return tmp_path_factory.getbasetemp() / "browser-screenshots"


@pytest.fixture
def site(project: Path) -> Iterator[tuple[Served, dict[str, str]]]:
    mem = Memory.open(project)
    ids = {}
    for key, record in {
            "jwt": rec("Decision: use jose for JWT instead of jsonwebtoken", "jsonwebtoken lacks EdDSA; jose "
                       "supports it and is maintained.", tags=["auth", "jwt"], provenance="CITED"),
            "pnpm": rec("Pin pnpm with corepack: CI cache broke on lockfile drift", "Run corepack enable in CI "
                        "and pin packageManager in package.json.", tags=["ci", "pnpm"], phase="M002-S001-T0003"),
            "scim": rec("SCIM 2.0 provisioning for Okta", "Okta suspends users through PATCH active=false per "
                        "tenant.", type="research", tags=["okta"]),
            "money": rec("Money is stored as integer minor units, never floats", "Use integer cents everywhere; "
                         "convert only at the edges.", type="learning", tags=["billing"])}.items():
        ids[key] = mem.add(record)["id"]
    with serve(project) as running:
        yield running, ids


def url(served: Served, path: str = "/") -> str:
    return f"http://127.0.0.1:{served.port}{path}"


def wait_for(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def status_says(driver: Any, text: str) -> bool:
    """Whether the page's status line comes to say ``text`` (the page that follows a form's post may still be
    loading: the previous page's status element goes stale, and is looked for again)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return bool(WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException, NoSuchElementException))
                .until(lambda d: text in d.find_element(By.CSS_SELECTOR, "[role=status]").text))


def test_search_open_pin_forget_and_health(driver, site, shots, project):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    served, ids = site
    shots.mkdir(parents=True, exist_ok=True)
    # search, from the keyboard: "/" focuses the box, Enter submits
    driver.get(url(served, "/health"))
    wait_for(driver, "main")
    driver.find_element(By.TAG_NAME, "body").send_keys("/")  # on another page: goes to the search page
    wait_for(driver, "#q")
    driver.find_element(By.TAG_NAME, "body").send_keys("/")
    box = driver.switch_to.active_element
    assert box.get_attribute("id") == "q"
    box.send_keys("jwt EdDSA", Keys.ENTER)
    wait_for(driver, "ol.hits li.hit")
    titles = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "li.hit h3 a")]
    assert titles[0] == "Decision: use jose for JWT instead of jsonwebtoken"
    driver.save_screenshot(str(shots / "search.png"))

    # the CLI's filters and syntax
    driver.get(url(served, "/?q=okta+users+pnpm&type=research"))
    wait_for(driver, "ol.hits")
    assert [a.text for a in driver.find_elements(By.CSS_SELECTOR, "li.hit h3 a")] == ["SCIM 2.0 provisioning for Okta"]
    driver.get(url(served, "/?q=pnpm+OR+cents"))
    wait_for(driver, "ol.hits")
    found = {a.text for a in driver.find_elements(By.CSS_SELECTOR, "li.hit h3 a")}
    assert found == {"Pin pnpm with corepack: CI cache broke on lockfile drift",
                     "Money is stored as integer minor units, never floats"}
    driver.get(url(served, "/?q=pnpm+OR+cents+OR+okta+OR+jwt&mode=lexical"))
    wait_for(driver, "ol.hits")
    assert len(driver.find_elements(By.CSS_SELECTOR, "li.hit")) == 4
    driver.save_screenshot(str(shots / "search-results.png"))
    driver.get(url(served, "/?q=corepack&phase=M002"))
    wait_for(driver, "ol.hits")
    assert len(driver.find_elements(By.CSS_SELECTOR, "li.hit")) == 1
    driver.get(url(served, "/?q=corepack&phase=M002&phase_exact=1"))
    wait_for(driver, "main")
    assert not driver.find_elements(By.CSS_SELECTOR, "li.hit")
    assert driver.find_element(By.NAME, "phase_exact").is_selected()  # the form keeps what was asked
    driver.get(url(served, "/?q=pnpm&type=learnings"))
    alert = wait_for(driver, "[role=alert]")
    assert "query-invalid-type" in alert.text

    # open the record: Tab to its link, Enter
    driver.get(url(served, "/?q=corepack"))
    wait_for(driver, "ol.hits li.hit")
    link = driver.find_element(By.CSS_SELECTOR, "li.hit h3 a")
    link.send_keys(Keys.ENTER)
    wait_for(driver, "table.fields")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Pin pnpm with corepack: CI cache broke on lockfile drift"
    cells = {row.find_element(By.TAG_NAME, "th").text: row.find_element(By.TAG_NAME, "td").text
             for row in driver.find_elements(By.CSS_SELECTOR, "table.fields tr")}
    assert cells["id"] == ids["pnpm"] and cells["phase"] == "M002-S001-T0003" and "pnpm" in cells["tags"]
    assert driver.find_elements(By.CSS_SELECTOR, "ol.history li")
    driver.save_screenshot(str(shots / "record.png"))

    # pin it
    driver.find_element(By.XPATH, "//button[text()='Pin']").click()
    assert status_says(driver, "Done: pinned")
    assert driver.find_elements(By.XPATH, "//button[text()='Unpin']")
    scan = Memory.open(project).scan()
    assert scan.position[ids["pnpm"]] in scan.hot_positions()

    # forget it, with a reason
    reason = driver.find_element(By.NAME, "reason")
    reason.send_keys("superseded by ADR-7", Keys.ENTER)
    assert status_says(driver, "Done: forgotten")
    assert driver.find_element(By.CSS_SELECTOR, "p.status").text.startswith("retired")
    assert "superseded by ADR-7" in driver.find_element(By.CSS_SELECTOR, "ol.history").text
    got = Memory.open(project).get([ids["pnpm"]])["records"][0]
    assert not got["live"] and got["retired"]["reason"] == "superseded by ADR-7"
    driver.get(url(served, "/?q=corepack"))
    wait_for(driver, "main")
    assert not driver.find_elements(By.CSS_SELECTOR, "li.hit")  # gone from every result

    # the health report
    driver.get(url(served, "/health"))
    doctor = wait_for(driver, "pre.doctor")
    assert "nubos-memory doctor" in doctor.text
    assert "retired" in driver.find_element(By.CSS_SELECTOR, "table.fields").text
    driver.save_screenshot(str(shots / "health.png"))
    for name in ("search.png", "search-results.png", "record.png", "health.png"):
        assert (shots / name).stat().st_size > 10_000


def test_near_duplicates_and_conflicts_on_a_record_page(driver, project, shots):
    """A record folded into a newer near duplicate shows it, and the newer one shows the older."""
    from selenium.webdriver.common.by import By

    write_config(project, near_duplicate=0.5)
    mem = Memory.open(project)
    old = mem.add(rec("API rate limit is 100 requests per minute", "the gateway allows 100 requests per minute"))
    new = mem.add(rec("API rate limit is 1000 requests per minute", "the gateway allows 1000 requests per minute"))
    assert new["near_duplicate_of"] == old["id"]
    with serve(project) as served:
        driver.get(url(served, f"/record?id={old['id']}"))
        section = wait_for(driver, "main").text
        assert "Shown under the newer near duplicate" in section and new["id"] in section
        assert f"Conflict (number) with {new['id']}" in section
        driver.save_screenshot(str(shots / "record-near-duplicate.png"))
        driver.get(url(served, f"/record?id={new['id']}"))
        section = wait_for(driver, "main").text
        links = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "main ul li a")]
        assert old["id"] in links
        assert f"Conflict (number) with {old['id']}: the older one said “API rate limit is 100 requests per minute”" \
            in section


def test_a_page_from_another_origin_cannot_post_a_form(driver, site, tmp_path):
    """A page served from elsewhere (a file here) that posts the forget form is refused by the guard."""
    served, ids = site
    attack = tmp_path / "attack.html"
    attack.write_text(f"""<form id="f" method="post" action="{url(served, '/record/forget')}">
<input name="id" value="{ids['jwt']}"><input name="reason" value="gone"></form>
<script>document.getElementById('f').submit()</script>""")
    driver.get(attack.as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: d.current_url.startswith(url(served, "/record/forget")))
    assert "http-forbidden-origin" in wait_for(driver, "body").text  # the post was made, and refused
    assert Memory.open(served.service.warm.root).get([ids["jwt"]])["records"][0]["live"]
