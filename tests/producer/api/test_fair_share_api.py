"""The 429 for a branch past its fair share says so, with the share's rule and Retry-After."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from shared.config import Settings
from shared.policy import default_policy_text
from tests.producer.api.conftest import Api

CAP = 4


@pytest.fixture
def api_settings(api_settings: Settings, tmp_path: Path) -> Settings:
    text = default_policy_text().replace("cap = 70 ", f"cap = {CAP} ", 1)
    assert f"cap = {CAP} " in text
    path = tmp_path / "policy-small-complaint-cap.toml"
    path.write_text(text)
    return Settings(**api_settings.model_dump(exclude={"policy_file"}), policy_file=str(path))


def test_a_branch_past_its_share_gets_a_429_that_names_it(
    api: Api, branch: requests.Session, other_branch_key: str
) -> None:
    complaint = {"type": "complaint", "prompt": "charged twice"}
    for _ in range(CAP):
        assert branch.post(api.url("/v1/tickets"), json=complaint).status_code == 202
    with api.session(other_branch_key) as other:
        assert other.post(api.url("/v1/tickets"), json=complaint).status_code == 202
    refused = branch.post(api.url("/v1/tickets"), json=complaint)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "branch_share_exceeded" and error["type"] == "rate_limit_exceeded"
    assert "fair share" in error["message"] and f"the {CAP} complaint requests" in error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    record = branch.get(api.url(f"/v1/tickets/{error['ticket_id']}")).json()
    assert record["status"] == "rejected" and "fair share" in record["error"]
