# syntax=docker/dockerfile:1
# One image for every tidegate process (api, worker, monitor, sim-vllm, the rq action worker).
# The wheel is built in a throwaway stage so the runtime image holds no source tree: `rq worker`
# imports from its working directory first, and that must not shadow the installed package.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tidegate ./tidegate
COPY shared ./shared
COPY producer ./producer
COPY worker ./worker
COPY ops ./ops
COPY clients/python ./clients/python
# The client is its own distribution, which tidegate depends on: both wheels go in the image.
RUN pip wheel --no-deps --wheel-dir /wheels ./clients/python .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# Both wheels are this build's own (naming the client's lets `tidegate[all]` resolve it locally);
# `[all]` names the extras, whose versions pyproject.toml bounds.
# hadolint ignore=DL3013
RUN client=$(ls /wheels/tidegate_client-*.whl) && wheel=$(ls /wheels/tidegate-*.whl) \
    && pip install "${client}" "${wheel}[all]" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 tidegate \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/tidegate tidegate
# Numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/tidegate
# api, sim-vllm, monitor metrics, worker metrics
EXPOSE 8080 8000 9108 9109
ENTRYPOINT ["tidegate"]
CMD ["--help"]
