"""An outside load generator against the front door: inference-perf's figures beside tidegate's own.

`tool` installs and runs inference-perf (a lab extra in a Python 3.12 virtualenv of its own),
`config` writes its configuration from `inference-perf.yaml`, `report` reads what it wrote,
`tickets` reads the same requests as tidegate recorded them, `compare` sets the two side by side,
and `bench` runs the whole thing on a fresh stack (`tidegate bench inference-perf`).
"""
