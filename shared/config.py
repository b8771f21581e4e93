"""Process settings from flags, `TIDEGATE_*` environment variables and `.env`.

Precedence: command-line flags (applied by each command with `model_copy(update=...)`) override the
environment, which overrides the policy file. The policy holds what a bank tunes per deployment
(types, thresholds); settings hold what an operator sets per process (URLs, margins).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.policy import Policy, load_policy
from shared.redis_conn import parse_sentinels, with_ca_certs

QUEUE_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
"""What a queue's name may be: it becomes part of every key's hash tag."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIDEGATE_", env_file=".env", extra="ignore")

    redis_url: str | None = Field(
        default=None, description="unset: a Redis on 127.0.0.1:6379 if one answers (demo: else embedded)"
    )
    redis_cluster: bool = Field(
        default=False, description="the Redis URL names a node of a Redis Cluster (any node will do)"
    )
    redis_sentinels: str | None = Field(
        default=None, description="host:port,... of the Sentinels that name the primary (URL then optional)"
    )
    redis_sentinel_master: str | None = Field(
        default=None, description="the primary's name at the Sentinels (with redis_sentinels)"
    )
    rq_redis_url: str | None = Field(
        default=None,
        description="the Redis of rq's jobs (alarm actions, callbacks); default the queue's; needed on a Cluster",
    )
    redis_ssl_ca_certs: str | None = Field(
        default=None,
        description="CA file that signed the Redis server's certificate (with a rediss:// URL)",
    )
    replica_acks: int = Field(
        default=0, ge=0, le=16, description="replicas that must hold a ticket before it is acknowledged"
    )
    queue_name: str = Field(default="default", pattern=QUEUE_NAME_PATTERN, description="the queue's name")
    fallback_vllm_url: str | None = Field(
        default=None,
        description="fallback endpoints, comma-separated; one is used only while its model version "
        "matches the primary's",
    )
    policy_file: str | None = None
    lease_seconds: float | None = Field(
        default=None, gt=0, description="lease of a claimed ticket (default: the policy's)"
    )
    max_attempts: int | None = Field(
        default=None, ge=1, description="attempts before `failed` (default: the policy's)"
    )
    api_max_body_bytes: int = Field(default=1_048_576, ge=1024)
    operator_key: str | None = Field(default=None, description="bootstrap operator API key")
    metrics_auth: Literal["none", "operator"] = Field(
        default="none",
        description="who may read the API's /metrics: anyone who reaches the port (none), or operator "
        "keys only (operator: Prometheus sends one as a bearer token)",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="serve the API's /metrics on this port of its own (e.g. one only Prometheus can "
        "reach) instead of the API port, which then answers 404 there",
    )
    metrics_host: str | None = Field(
        default=None, description="address the metrics port binds (default: the API's --host)"
    )
    ssl_certfile: str | None = Field(
        default=None, description="the API's TLS certificate (PEM); with ssl_keyfile the API serves HTTPS"
    )
    ssl_keyfile: str | None = Field(default=None, description="the private key of ssl_certfile (PEM)")

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str | None) -> str | None:
        if value is not None:
            parse_sentinels(value)
        return value

    @model_validator(mode="after")
    def _tls(self) -> Settings:
        """The Redis CA travels inside the URLs, so every client built from them (rq's jobs, the
        callback sender, the API's workers) verifies the server the same way."""
        if self.redis_ssl_ca_certs is not None:
            self.redis_url = with_ca_certs(self.redis_url, self.redis_ssl_ca_certs, "redis_url")
            if self.rq_redis_url is not None:
                self.rq_redis_url = with_ca_certs(self.rq_redis_url, self.redis_ssl_ca_certs, "rq_redis_url")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile: give both ssl_certfile and ssl_keyfile, or neither")
        return self

    @model_validator(mode="after")
    def _one_topology(self) -> Settings:
        if self.redis_sentinels is not None:
            if not self.redis_sentinel_master:
                raise ValueError("redis_sentinel_master: required with redis_sentinels (the primary's name)")
            if self.redis_cluster:
                raise ValueError("redis_cluster: a Cluster has no Sentinels; set one of the two")
        return self

    @cached_property
    def policy(self) -> Policy:
        """The policy file with this process's overrides applied."""
        policy = load_policy(self.policy_file)
        overrides: dict[str, object] = {}
        if self.lease_seconds is not None:
            overrides["lease_seconds"] = self.lease_seconds
        if self.max_attempts is not None:
            overrides["max_attempts"] = self.max_attempts
        if overrides:
            policy = policy.model_copy(update={"queue": policy.queue.model_copy(update=overrides)})
        return policy


def setting_help(name: str) -> str:
    """A command-line option's help from its setting: what it does, its variable and its default."""
    field = Settings.model_fields[name]
    default = "" if field.default is None else f", default {field.default}"
    words = field.description or name
    return f"{words[:1].upper()}{words[1:]} [TIDEGATE_{name.upper()}{default}]."
