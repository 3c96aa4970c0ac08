"""sd_notify without a dependency: READY, STOPPING, STATUS and watchdog pings."""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "watchdog_interval"]


def notify(*states: str) -> bool:
    """Send ``READY=1``-style lines to systemd; False when not run by systemd (no socket)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Half of ``WatchdogSec`` in seconds, when systemd asked for pings."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
