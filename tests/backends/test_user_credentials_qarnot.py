"""Per-user credentials on Qarnot: what is Qarnot's own (docs/backends.md "Per-user credentials").
What every provider does is proved in test_remote_contract.py over the Qarnot driver
(tests/backends/conftest.py), whose double checks every call about a case against its owner's
account (``expect_owner``).
"""

import pytest

from apps.credentials.models import RemoteConnection
from tests.backends.conftest import QarnotDriver

pytestmark = pytest.mark.django_db

PROVIDER = "qarnot"  # the ``driver`` fixture's
(ADA_TOKEN,) = QarnotDriver.credentials["ada"]


@pytest.fixture
def user_pool(driver):
    return driver.pool


def test_a_script_keeps_its_qarnot_token_through_the_api_and_never_gets_it_back(user_pool, ada, api):
    client = api(ada)
    url = f"/api/v1/connections/{user_pool.pk}/"
    refused = client.put(url, {"token": "not-a-token-of-anyone"}, format="json")
    assert refused.status_code == 400 and "Qarnot refused this token" in refused.json()["detail"]
    assert not RemoteConnection.objects.exists()
    wrong = client.put(url, {"client_id": "x", "client_secret": "y"}, format="json")
    assert wrong.status_code == 400 and "'token'" in str(wrong.json())
    answer = client.put(url, {"token": ADA_TOKEN}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["state"], body["subject"]) == ("connected", "ada@example.org")
    assert ADA_TOKEN not in answer.content.decode()
    assert RemoteConnection.objects.get(user=ada, pool=user_pool).subject == "ada@example.org"
    gone = client.delete(url)
    assert gone.status_code == 200 and gone.json() == QarnotDriver.disconnected
    assert not RemoteConnection.objects.exists() and ADA_TOKEN not in gone.content.decode()
