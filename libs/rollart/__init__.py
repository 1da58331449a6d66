"""RollArt shared library: generated rollart.v1 stubs, the gRPC runtime, the Worker/Cluster SDK and the CLI.

Never imports torch or vllm: every service depends on it, including ones that must stay light (relay, ledger).
"""

__version__ = "0.1.0"
