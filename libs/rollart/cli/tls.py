"""TLS client settings of the command line tools: the same ``tls`` keys the services read.

Sources, last wins: the service configuration file (``--config`` or ``ROLLART_CONFIG``: only its ``tls``
section is read, so a container's health check uses its service's own file), ``ROLLART_TLS__*`` variables,
then the ``--tls-*`` flags. Only the client keys matter here: ``ca_file`` (turns TLS on), the client pair
(mTLS) and ``server_name``; a service's server pair in the same section is validated but not used.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import grpc
from pydantic import ConfigDict

from rollart.runtime import client
from rollart.runtime.config import ConfigError, StrictModel, TLSConfig, load_config

# flag suffix -> TLSConfig key
FLAGS = {
    "ca-file": "ca_file",
    "client-cert-file": "client_cert_file",
    "client-key-file": "client_key_file",
    "server-name": "server_name",
}


class ClientSettings(StrictModel):
    """What a client tool takes from a service configuration: the ``tls`` section; other keys are ignored."""

    model_config = ConfigDict(extra="ignore")
    tls: TLSConfig | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--tls-*`` on a subcommand that opens a gRPC channel."""
    group = parser.add_argument_group("TLS (default: the tls keys of --config / ROLLART_CONFIG and ROLLART_TLS__*)")
    group.add_argument("--config", dest="tls_config", metavar="PATH", help="a service configuration file")
    group.add_argument("--tls-ca-file", help="CA of the server certificate (turns TLS on)")
    group.add_argument("--tls-client-cert-file", help="client certificate for mTLS")
    group.add_argument("--tls-client-key-file", help="client key for mTLS")
    group.add_argument("--tls-server-name", help="name to verify in the server certificate instead of the host")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> TLSConfig | None:
    """The effective client TLS settings; None means plaintext. Raises ConfigError naming a bad key."""
    environ = os.environ if environ is None else environ
    overrides: dict[str, Any] = {}
    for flag, key in FLAGS.items():
        value = getattr(args, "tls_" + flag.replace("-", "_"), None)
        if value:
            overrides[key] = value
    settings = load_config(
        ClientSettings,
        getattr(args, "tls_config", None),
        environ,
        {"tls": overrides} if overrides else None,
    )
    return settings.tls


def sync_channel(address: str, tls: TLSConfig | None) -> grpc.Channel:
    """A blocking channel: TLS (mTLS with a client pair) when ``tls`` names a CA or a client pair."""
    return client.sync_channel(address, token=None, tls=tls)[0]


def channel_or_exit(prog: str, args: argparse.Namespace, address: str) -> grpc.Channel:
    """The channel for a subcommand, or exit 1 with one line naming the bad TLS setting."""
    try:
        tls = from_args(args)
    except ConfigError as exc:
        raise SystemExit(f"{prog}: {' '.join(str(exc).split())}") from None
    return sync_channel(address, tls)
