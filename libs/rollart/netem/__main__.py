"""``python -m rollart.netem TARGET [--rate B/s] [--link-rate B/s] [--rtt S] ...``: one WAN emulator process."""

import asyncio

from rollart.netem.wan import _main

asyncio.run(_main())
