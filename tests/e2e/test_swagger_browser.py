"""Swagger UI in a real browser (issue 38): headless Chromium (tests/browser.py) against a running server with
API keys on.  /v2/docs loads without a key but shows the server's 401 words instead of the API; with the key
typed into the page it renders the whole API with the infer operation; /v2/models/minilm/docs then renders
minilm's document, naming its input.  With AIENG_SCREENSHOTS=1 it saves docs/img/swagger.png."""
from __future__ import annotations

import os

import pytest
from selenium.webdriver.common.by import By

from tests.browser import chrome, text_when, wait_for
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.browser]  # run after the rest, alone (scripts/test.sh)

KEY = "page-key-0123456789abcdef0"
REFUSED = "a valid API key is needed: Authorization: Bearer <key>"


def test_swagger_ui_asks_for_the_key_then_shows_the_api_and_a_models_inputs(make_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice:{KEY}\n")
    srv = make_server(AIENG_MODELS="minilm,tabular", AIENG_OIP_API_KEYS_FILE=str(keys)).start()
    with chrome(tmp_path) as d:
        d.get(f"http://{srv.oip_http}/v2/docs")
        assert text_when(d, "#aieng-error", lambda t: "401" in t) == f"401 {REFUSED}"
        wait_for(d, "#aieng-key").send_keys(KEY)
        d.find_element(By.CSS_SELECTOR, "#aieng-key-form button[type=submit]").click()
        paths = text_when(d, "#swagger-ui", lambda t: "/v2/models/{model_name}/infer" in t, timeout=30)
        assert "Authorize" in paths  # the bearer scheme's button: the API takes keys
        assert not d.find_element(By.CSS_SELECTOR, "#aieng-error").is_displayed()
        if os.environ.get("AIENG_SCREENSHOTS") == "1":
            d.save_screenshot(os.path.join(ROOT, "docs", "img", "swagger.png"))
        d.get(f"http://{srv.oip_http}/v2/models/minilm/docs")  # the key stays in this tab's session
        page = text_when(d, "#swagger-ui", lambda t: "/v2/models/minilm/infer" in t, timeout=30)
        assert "Inputs: text." in page and "minilm.input.text" in page
