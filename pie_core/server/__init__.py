"""``pie serve``: the WebSocket + HTTP server (protocol in docs/server.md)."""

from pie_core.server.app import PieServer, ServerOptions
from pie_core.server.auth import Authenticator
from pie_core.server.launcher import InProcessLauncher, Launcher

__all__ = ["PieServer", "ServerOptions", "Authenticator", "Launcher", "InProcessLauncher"]
