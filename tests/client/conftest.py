"""The client's tests run against the real API: the API tests' fixtures, shared."""

from tests.producer.api.conftest import api, api_settings, branch_key  # noqa: F401  (fixtures)
