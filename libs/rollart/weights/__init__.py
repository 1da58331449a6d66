"""The weight plane: how version ``v`` of the policy gets from the trainer to every actor.

Modules (import them directly; this package imports nothing eagerly, so each stays usable alone):

- ``transport``: striped, authenticated TCP transport of delta segments (resume after drops).
- ``hub``: the per-version segment buffers, bounded disk cache, subscribers, events and commit fan-out
  shared by the relay service and the trainer's publisher; ``hub_state``: its buffers and subscriber records.
- ``relay_api``: the ``rollart.v1.Relay`` gRPC servicer over a hub.
- ``follower``: follows a relay-like source (events, striped pulls, failover to fallbacks).
- ``staging``: the state machine of staged versions (arriving, staged, rejected; routes to a version).
- ``subscriber``: ``DeltaSource`` (receives ``D_v`` from a relay into staging, fetches missed ones) and the
  standalone ``WeightSubscriber`` (commits, bootstraps joiners).
- ``publisher``: publishes a version (full checkpoint every K, the delta stream, buckets).
- ``checkpoint_store``, ``buckets``: full checkpoints and Mooncake buckets; ``mooncake_client``: the store client.
"""
