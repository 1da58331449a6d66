"""Authentication: a bearer job token on every RPC (except health and reflection), optional TLS/mTLS."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import grpc
from grpc import aio

from .config import TLSConfig
from .handlers import aborting

# Methods a load balancer or prober must reach without the job's secret.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
AUTH_METADATA_KEY = "authorization"


def bearer(token: str) -> tuple[str, str]:
    return (AUTH_METADATA_KEY, f"Bearer {token}")


class TokenAuthInterceptor(aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <job token>`` with UNAUTHENTICATED."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method.startswith(UNAUTHENTICATED_PREFIXES):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return handler
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == AUTH_METADATA_KEY:
                presented = value.encode() if isinstance(value, str) else value
                break
        if presented is None:
            return aborting(handler, grpc.StatusCode.UNAUTHENTICATED, "missing bearer job token")
        if not hmac.compare_digest(presented, self._expected):
            return aborting(handler, grpc.StatusCode.UNAUTHENTICATED, "invalid job token")
        return handler


def server_credentials(tls: TLSConfig | None) -> grpc.ServerCredentials | None:
    """TLS server credentials, with client certificates required when ``client_ca_file`` is set."""
    if tls is None or tls.cert_file is None:
        return None
    pair = [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())]  # type: ignore[union-attr]
    if tls.client_ca_file is not None:
        return grpc.ssl_server_credentials(
            pair, root_certificates=tls.client_ca_file.read_bytes(), require_client_auth=True
        )
    return grpc.ssl_server_credentials(pair)


def channel_credentials(tls: TLSConfig | None) -> grpc.ChannelCredentials | None:
    """Client TLS credentials (with a client pair for mTLS); None means plaintext."""
    if tls is None or (tls.ca_file is None and tls.client_cert_file is None):
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
        private_key=tls.client_key_file.read_bytes() if tls.client_key_file else None,
        certificate_chain=tls.client_cert_file.read_bytes() if tls.client_cert_file else None,
    )
