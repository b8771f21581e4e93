"""The OpenAI-compatible surface over real HTTP: shapes, token accounting, streaming and 400s."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from ops.lab.sim.process import SimulatorProcess
from ops.lab.sim.profiles import A100_7B
from ops.lab.sim.tokens import count_chat_tokens, count_text_tokens
from tests.lab.sim.conftest import complete, metric, scrape, token_ids

MAX_MODEL_LEN = 2048


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(time_scale=50, max_model_len=MAX_MODEL_LEN, seed=7) as process:
        yield process


def sse_events(response: requests.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines(decode_unicode=True) if line]


def test_health_and_models(sim: SimulatorProcess) -> None:
    assert requests.get(f"{sim.base_url}/health", timeout=5).status_code == 200
    models = requests.get(f"{sim.base_url}/v1/models", timeout=5).json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == A100_7B.model and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == MAX_MODEL_LEN


def test_version_and_load(sim: SimulatorProcess) -> None:
    assert requests.get(f"{sim.base_url}/version", timeout=5).json() == {"version": "0.32.0"}
    assert requests.get(f"{sim.base_url}/load", timeout=5).json() == {"server_load": 0}


def test_completion_counts_token_ids_exactly_and_honours_max_tokens(sim: SimulatorProcess) -> None:
    response = requests.post(
        f"{sim.base_url}/v1/completions",
        json={"model": A100_7B.model, "prompt": token_ids(321), "max_tokens": 37, "ignore_eos": True},
        headers={"X-Request-Id": "branch-17-ticket-9"},
        timeout=30,
    )
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == "cmpl-branch-17-ticket-9"
    assert "x-request-id" not in response.headers  # vLLM does not echo it (ops/lab/vllm_cpu/OBSERVED.md)
    assert body["object"] == "text_completion" and body["model"] == A100_7B.model
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert len(choice["text"].split()) == 37
    assert body["usage"] == {
        "prompt_tokens": 321,
        "completion_tokens": 37,
        "total_tokens": 358,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert body["system_fingerprint"].startswith("tidegate-sim-") and body["service_tier"] is None


def test_text_prompts_follow_the_documented_approximation(sim: SimulatorProcess) -> None:
    prompt = "Loan application 4471: applicant requests 250000 over 20 years, income verified."
    body = complete(sim.base_url, prompt=prompt, max_tokens=5).json()
    assert body["usage"]["prompt_tokens"] == count_text_tokens(prompt) == 20  # 80 characters / 4
    short_words = complete(sim.base_url, prompt="a b c d e f", max_tokens=5).json()
    assert short_words["usage"]["prompt_tokens"] == 6  # one per word beats 11 characters / 4


def test_stop_lengths_are_seeded_and_bounded_by_max_tokens(sim: SimulatorProcess) -> None:
    lengths, reasons = [], set()
    for i in range(12):
        body = complete(sim.base_url, prompt=f"ticket {i} summary", max_tokens=300, request_id=f"r{i}").json()
        usage, choice = body["usage"], body["choices"][0]
        assert 1 <= usage["completion_tokens"] <= 300
        assert choice["finish_reason"] == ("length" if usage["completion_tokens"] == 300 else "stop")
        assert body["id"] == f"cmpl-r{i}"
        again = complete(sim.base_url, prompt=f"ticket {i} summary", max_tokens=300).json()
        assert again["usage"]["completion_tokens"] == usage["completion_tokens"]
        lengths.append(usage["completion_tokens"])
        reasons.add(choice["finish_reason"])
    assert len(set(lengths)) > 3, "stop lengths should vary from prompt to prompt"
    assert "stop" in reasons


def test_chat_completion_shape_and_usage(sim: SimulatorProcess) -> None:
    messages = [
        {"role": "system", "content": "You approve loans."},
        {"role": "user", "content": [{"type": "text", "text": "Approve loan 12?"}]},
    ]
    response = requests.post(
        f"{sim.base_url}/v1/chat/completions",
        json={"messages": messages, "max_completion_tokens": 9, "ignore_eos": True, "request_id": "chat-1"},
        timeout=30,
    )
    body = response.json()
    assert body["id"] == "chatcmpl-chat-1" and body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and len(message["content"].split()) == 9
    assert body["choices"][0]["finish_reason"] == "length"
    prompt_tokens = count_chat_tokens(["You approve loans.", "Approve loan 12?"])
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["total_tokens"] == prompt_tokens + 9


def test_streamed_completion_matches_the_plain_one(sim: SimulatorProcess) -> None:
    request = {"prompt": token_ids(50), "max_tokens": 60, "ignore_eos": True}
    plain = complete(sim.base_url, **request).json()
    with requests.post(
        f"{sim.base_url}/v1/completions",
        json=request | {"stream": True, "stream_options": {"include_usage": True}},
        stream=True,
        timeout=30,
    ) as response:
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    content = chunks[:-1]
    assert len(content) == 60, "vLLM sends one chunk per token"
    assert "".join(chunk["choices"][0]["text"] for chunk in content) == plain["choices"][0]["text"]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert content[-1]["system_fingerprint"] == plain["system_fingerprint"]
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in content[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 50, "total_tokens": 110, "completion_tokens": 60}


def test_streamed_chat_opens_with_the_role_and_omits_usage_unless_asked(sim: SimulatorProcess) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(f"{sim.base_url}/v1/chat/completions", json=body, stream=True, timeout=30) as response:
        events = sse_events(response)
    assert len(events) == 6, "role, four tokens, [DONE]"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(chunk["object"] == "chat.completion.chunk" and "usage" not in chunk for chunk in chunks)
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert len(text.split()) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks[:-1])


def test_a_one_message_chat_counts_as_vllm_counted_it(sim: SimulatorProcess) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    usage = requests.post(f"{sim.base_url}/v1/chat/completions", json=body, timeout=30).json()["usage"]
    assert usage["prompt_tokens"] == 5


def test_token_counters_in_metrics_follow_usage(sim: SimulatorProcess) -> None:
    prompt_before = metric(sim.base_url, "vllm:prompt_tokens_total")
    generated_before = metric(sim.base_url, "vllm:generation_tokens_total")
    usage = complete(sim.base_url, prompt=token_ids(77), max_tokens=23, ignore_eos=True).json()["usage"]
    assert metric(sim.base_url, "vllm:prompt_tokens_total") - prompt_before == usage["prompt_tokens"] == 77
    assert metric(sim.base_url, "vllm:generation_tokens_total") - generated_before == 23


def test_metrics_carry_the_vllm_names_and_labels(sim: SimulatorProcess) -> None:
    complete(sim.base_url, prompt="warm up", max_tokens=3)
    samples = scrape(sim.base_url)
    expected = [
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
        "vllm:cache_config_info",
    ]
    for name in expected:
        assert name in samples, name
        assert all(sample.labels["model_name"] == A100_7B.model for sample in samples[name])
        assert all(sample.labels["engine"] == "0" for sample in samples[name])
    assert "vllm:gpu_cache_usage_perc" not in samples
    info = samples["vllm:cache_config_info"][0]
    assert info.value == 1.0
    assert info.labels["num_gpu_blocks"] == str(A100_7B.kv_blocks) and info.labels["block_size"] == "16"
    assert info.labels["gpu_memory_utilization"] == "0.9"
    assert samples["vllm:e2e_request_latency_seconds_count"][0].value >= 1


BAD = "BadRequestError"
SCHEMA = "Bad Request"


@pytest.mark.parametrize(
    ("path", "body", "status", "err_type", "param", "message"),
    [
        (
            "/v1/completions",
            {"max_tokens": 5},
            400,
            BAD,
            "prompt",
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        ),
        (
            "/v1/completions",
            {"prompt": "", "max_tokens": 5},
            400,
            BAD,
            "prompt",
            "Either prompt or prompt_embeds",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 0},
            400,
            BAD,
            "max_tokens",
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": MAX_MODEL_LEN + 1},
            400,
            BAD,
            "max_tokens",
            f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len={MAX_MODEL_LEN}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={MAX_MODEL_LEN + 1})",
        ),
        (
            "/v1/completions",
            {"prompt": token_ids(MAX_MODEL_LEN + 1), "max_tokens": 1},
            400,
            BAD,
            "input_tokens",
            f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains at "
            f"least {MAX_MODEL_LEN + 1} input tokens, which exceeds this limit even without any output tokens. "
            f"Please reduce the length of the input prompt. (parameter=input_tokens, value={MAX_MODEL_LEN + 1})",
        ),
        ("/v1/completions", {"prompt": [5, 99_999], "max_tokens": 1}, 400, BAD, "prompt", "Token id 99999"),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 3, "temperature": -1},
            400,
            BAD,
            "temperature",
            "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        ),
        ("/v1/completions", {"prompt": "hi", "n": 3}, 400, BAD, "n", "n is not supported by the simulator"),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": "many"},
            400,
            SCHEMA,
            "body.max_tokens",
            "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens'",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "model": "gpt-9"},
            404,
            "NotFoundError",
            "model",
            f"The model `gpt-9` does not exist. Valid aliases: {A100_7B.model}.",
        ),
        (
            "/v1/chat/completions",
            {"max_tokens": 5},
            400,
            SCHEMA,
            "body.messages",
            "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
            "'input': '<dict of 1 items>'}",
        ),
        (
            "/v1/chat/completions",
            {"messages": [], "max_tokens": 5},
            400,
            BAD,
            None,
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
        ),
    ],
)
def test_bad_requests_get_the_errors_vllm_sends(
    sim: SimulatorProcess,
    path: str,
    body: dict[str, object],
    status: int,
    err_type: str,
    param: str | None,
    message: str,
) -> None:
    """The bodies recorded from real vLLM in ops/lab/vllm_cpu/observed-http.md."""
    response = requests.post(f"{sim.base_url}{path}", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["message"].startswith(message)
    assert error == {"message": error["message"], "type": err_type, "param": param, "code": status}


def test_a_body_that_is_not_json_is_a_schema_400(sim: SimulatorProcess) -> None:
    response = requests.post(f"{sim.base_url}/v1/completions", data=b"not json", timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.0', 'msg': 'JSON decode error', "
        "'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}",
        "type": "Bad Request",
        "param": "body.0",
        "code": 400,
    }


def test_output_is_cut_to_the_context_left_rather_than_refused(sim: SimulatorProcess) -> None:
    body = complete(sim.base_url, prompt=token_ids(1501), max_tokens=1900, ignore_eos=True).json()
    assert body["usage"]["completion_tokens"] == MAX_MODEL_LEN - 1501
    assert body["usage"]["total_tokens"] == MAX_MODEL_LEN
    assert body["choices"][0]["finish_reason"] == "length"


def test_priority_is_accepted_and_ignored_under_fcfs(sim: SimulatorProcess) -> None:
    response = complete(sim.base_url, prompt="x", max_tokens=2, priority=5)
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 2


def test_stop_median_tokens_sets_how_long_answers_run() -> None:
    with SimulatorProcess(time_scale=50, stop_median_tokens=1_000_000) as long_answers:
        for i in range(5):
            body = complete(long_answers.base_url, prompt=f"ticket {i}", max_tokens=200).json()
            assert (
                body["usage"]["completion_tokens"] == 200 and body["choices"][0]["finish_reason"] == "length"
            )
    with SimulatorProcess(time_scale=50, stop_median_tokens=3) as short_answers:
        lengths = [
            complete(short_answers.base_url, prompt=f"ticket {i}", max_tokens=200).json()["usage"][
                "completion_tokens"
            ]
            for i in range(5)
        ]
        assert max(lengths) < 20
