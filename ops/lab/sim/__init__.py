"""A vLLM-compatible inference server whose GPUs are simulated (`tidegate sim-vllm`).

It stands in for vLLM where no GPU exists: workers, benchmarks, the demo and capacity planning run
against the same HTTP surface, KV-cache limits and batching behaviour. PROFILES.md describes the
profiles and the simulator-only endpoints.
"""
