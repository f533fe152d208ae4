"""``pie serve``: the WebSocket + HTTP server (protocol in docs/server.md)."""

from pie_core.runtime.launcher import InProcessLauncher, Launcher
from pie_core.server.app import PieServer, ServerOptions
from pie_core.server.auth import Authenticator

__all__ = ["PieServer", "ServerOptions", "Authenticator", "Launcher", "InProcessLauncher"]
