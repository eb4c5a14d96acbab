"""The landing and try-it pages in a real browser (issue 38): the distribution's headless Chromium, driven by
Selenium (tests/browser.py), against the real server.  A sentence typed into minilm's page comes back as an
embedding (dimension 384, its norm shown); a page image picked for orientation comes back as one of its
labels; a tabular row comes back as a species with a bar per class; every answer shows its stage timings.
The landing page lists the models with links to their pages.  With API keys on, the pages show the server's
401 words until a key is given in the page's field, then the models.  With AIENG_SCREENSHOTS=1 the test
saves the screenshots docs/ shows (docs/img/landing.png, tryit-minilm.png, tryit-orientation.png).
"""
from __future__ import annotations

import os

import pytest
from selenium.webdriver.common.by import By

from tests.browser import chrome, text_when, wait_for
from tests.conftest import ROOT
from tests.e2e.ocr_pages import make_page, png
from tests.e2e.test_oip_keys import ALICE, REFUSED, key_file

pytestmark = [pytest.mark.e2e, pytest.mark.browser]  # run after the rest, alone (scripts/test.sh)

MODELS = ["layout", "minilm", "ocr", "orientation", "tabular", "textdet", "textrec"]
SHOTS = os.environ.get("AIENG_SCREENSHOTS") == "1"


def shot(driver, name: str) -> None:
    if SHOTS:
        driver.save_screenshot(os.path.join(ROOT, "docs", "img", name))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from tests.conftest import ServerProcess

    s = ServerProcess(tmp_path_factory.mktemp("tryit"), AIENG_MODELS=",".join(MODELS)).start()
    yield s
    assert s.stop() == 0, s.output()
    assert s.segments() == []


def test_minilm_orientation_and_tabular_answer_in_the_browser(srv, tmp_path):
    base = f"http://{srv.oip_http}"
    image = tmp_path / "page.png"
    image.write_bytes(png(make_page(3, 600, 800)))
    with chrome(tmp_path, height=1000) as d:
        d.get(base + "/")
        text_when(d, "#status", lambda t: t.startswith("7 models"))
        rows = d.find_elements(By.CSS_SELECTOR, "#models tbody tr")
        assert [r.get_attribute("data-model") for r in rows] == MODELS
        rows = rows[1:]
        assert rows[0].find_element(By.LINK_TEXT, "try minilm").get_attribute("href") == \
            base + "/v2/models/minilm/try"
        docs = rows[0].find_element(By.LINK_TEXT, "docs")
        assert docs.get_attribute("href") == base + "/v2/models/minilm/docs"
        assert "1 (default): ready" in rows[0].text
        shot(d, "landing.png")

        d.get(base + "/v2/models/minilm/try")
        wait_for(d, "#in-0").send_keys("The quick brown fox jumps over the lazy dog.")
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#dim", lambda t: t != "") == "dimension 384"
        norm = text_when(d, "#norm", lambda t: t != "")
        assert norm == "norm 1.0000"  # minilm's embeddings are L2-normalised
        assert text_when(d, "#timing-total", lambda t: t.startswith("server ")).endswith(" ms")
        assert len(d.find_elements(By.CSS_SELECTOR, "#timing-bar > span")) >= 5
        shot(d, "tryit-minilm.png")

        d.get(base + "/v2/models/orientation/try")
        wait_for(d, "#in-0").send_keys(str(image))
        wait_for(d, "#preview-0")  # the picked file, previewed
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#label", lambda t: t != "") in {"0", "90", "180", "270"}
        assert len(d.find_elements(By.CSS_SELECTOR, "#bars .bar")) == 4
        text_when(d, "#timing-total", lambda t: t.startswith("server "))
        shot(d, "tryit-orientation.png")

        d.get(base + "/v2/models/tabular/try")
        for i, value in enumerate(("39.1", "18.7", "181", "3750", "Torgersen", "male")):
            wait_for(d, f"#in-{i}").send_keys(value)
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#label", lambda t: t != "") == "Adelie"
        bars = d.find_elements(By.CSS_SELECTOR, "#bars .bar")
        assert len(bars) == 3
        assert d.find_element(By.CSS_SELECTOR, "#bars").text.split("\n")[0] == "Adelie"  # best first

        for name in ("textdet", "layout"):  # boxes drawn over the picked image
            d.get(base + f"/v2/models/{name}/try")
            wait_for(d, "#in-0").send_keys(str(image))
            wait_for(d, "#preview-0")
            d.find_element(By.ID, "send").click()
            found = text_when(d, "#boxes", lambda t: t != "")
            assert found.endswith(" found") and int(found.split()[0]) > 0, (name, found)
            assert d.execute_script("const c = document.getElementById('overlay-0');"
                                    "return c.getContext('2d').getImageData(0, 0, c.width, c.height).data"
                                    ".some((v, i) => i % 4 === 3 && v > 0)") is True  # something drawn

        d.get(base + "/v2/models/ocr/try")
        wait_for(d, "#in-0").send_keys(str(image))
        wait_for(d, "#preview-0")
        d.find_element(By.ID, "send").click()
        wait_for(d, "#lines", timeout=60)
        lines = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#lines li")]
        assert any("Service Total Shipping" in line for line in lines), lines
        shot(d, "tryit-ocr.png")

        d.get(base + "/v2/models/tabular/try")  # a wrong value: the server's words and status
        wait_for(d, "#in-0")
        d.execute_script("document.getElementById('in-0').type = 'text'")
        d.find_element(By.ID, "in-0").send_keys("long")  # not a number: sent as null
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#error", lambda t: t != "") == \
            "400 Bad Request: input 'bill_length_mm': FP32 elements must be floats"


def test_with_keys_the_pages_show_the_401_words_until_a_key_is_given(make_server, tmp_path):
    path = key_file(tmp_path, f"alice:{ALICE}\n")
    srv = make_server(AIENG_MODELS="tabular", AIENG_OIP_API_KEYS_FILE=str(path)).start()
    base = f"http://{srv.oip_http}"
    with chrome(tmp_path) as d:
        d.get(base + "/")
        assert text_when(d, "#status", lambda t: t.startswith("401")) == f"401 Unauthorized: {REFUSED}"
        wait_for(d, "#key").send_keys(ALICE)
        d.find_element(By.CSS_SELECTOR, "#key-form button").click()
        text_when(d, "#status", lambda t: t.startswith("1 model"))
        assert [r.get_attribute("data-model") for r in d.find_elements(By.CSS_SELECTOR, "#models tbody tr")] \
            == ["tabular"]
        d.get(base + "/v2/models/tabular/try")  # the key is kept for this tab: the page is built, and answers
        wait_for(d, "#in-0").send_keys("45")
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#label", lambda t: t != "") in {"Adelie", "Chinstrap", "Gentoo"}
        d.execute_script("sessionStorage.clear()")
        d.get(base + "/v2/models/tabular/try")
        assert text_when(d, "#status", lambda t: t.startswith("401")) == f"401 Unauthorized: {REFUSED}"


def test_a_tensor_model_takes_nested_json_and_shows_its_values(make_server, tmp_path):
    from tests.conftest import save_tensor_model
    from tests.onnx_files import transpose_graph

    save_tensor_model(tmp_path / "repo", "transpose", transpose_graph())
    srv = make_server(AIENG_MODEL_REPOSITORY=str(tmp_path / "repo"), AIENG_PREPROCESS_WORKERS="1").start()
    with chrome(tmp_path) as d:
        d.get(f"http://{srv.oip_http}/v2/models/transpose/try")
        assert text_when(d, "#kind", lambda t: t != "") == "tensor"
        wait_for(d, "#in-0").send_keys("[[0, 1, 2], [3, 4, 5]]")
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#answer", lambda t: t != "") == "y: 0, 3, 1, 4, 2, 5"  # the transpose, row-major
        d.find_element(By.ID, "in-0").clear()
        d.find_element(By.ID, "in-0").send_keys("[[0, 1], [3, 4]]")
        d.find_element(By.ID, "send").click()
        assert text_when(d, "#error", lambda t: t != "").startswith("400 Bad Request: ")
