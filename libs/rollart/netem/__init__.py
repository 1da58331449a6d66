"""Network emulation on loopback, for tests and benchmarks: ``WanEmulator`` makes each TCP connection through it
behave like a long-haul flow (rate cap, shared link, round-trip delay, loss-like stalls, injected faults).

``python -m rollart.netem TARGET --rate ... --rtt ...`` runs one as a process and prints the address to dial.
"""

from rollart.netem.wan import ConnStats, LinkSpec, RateWindow, TokenBucket, WanEmulator

__all__ = ["ConnStats", "LinkSpec", "RateWindow", "TokenBucket", "WanEmulator"]
