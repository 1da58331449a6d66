"""Reward functions. Each one maps a finished trajectory (and its RewardSpec options) to a Verdict.

The heavy ones (math-verify, reasoning-gym, code tests in a sandbox, user-registered scorers) run inside pool
worker processes (``rollart_reward.worker``); the game outcome and the LLM judge run in the service's event loop.
"""
