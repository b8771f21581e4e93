"""The client's tests run against the real API: the API tests' fixtures, shared, and for streams
the OpenAI tests' gateway with a real worker in front of the simulator."""

from tests.producer.api.conftest import api, api_settings, branch_key  # noqa: F401  (fixtures)
from tests.producer.api.openai.conftest import (  # noqa: F401  (fixtures)
    backend,
    fast_policy,
    fast_policy_file,
    fast_queue,
    gateway,
    simulator,
    start_worker,
)
