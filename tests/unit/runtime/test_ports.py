"""rollart.runtime.ports: the default port table (deploy/ and the docs are checked in tests/unit/deploy)."""

from __future__ import annotations

import pytest

from rollart.runtime import ports


def test_listen_and_data_ports():
    assert ports.listen("relay") == "127.0.0.1:50053"
    assert ports.listen("trainer", "0.0.0.0") == "0.0.0.0:50054"
    assert ports.data_port("relay") == ports.EXTRA_PORTS["relay"]["data"] == 50063
    assert ports.data_port("trainer") == 50064
    with pytest.raises(KeyError):
        ports.data_port("ledger")
    with pytest.raises(KeyError):
        ports.listen("no-such-service")


def test_ports_are_distinct():
    grpc = list(ports.GRPC_PORTS.values())
    assert len(set(grpc)) == len(grpc) == 8
    assert sorted(grpc) == grpc  # the table lists the services in port order
