"""Python client SDK for ``pie serve`` (async; :func:`connect_sync` for blocking use).

Example::

    from pie_core.client import connect

    async with await connect("ws://127.0.0.1:8080", token) as client:
        program = await client.install("examples/text-completion")
        proc = await client.launch(program, {"prompt": "Hi"})
        async for ev in proc.events():
            print(ev.kind, ev.value)
"""

from pie_core.client.client import Client, ServerError, connect, pack_program
from pie_core.client.mcp_servers import McpHandler
from pie_core.client.process import Process, ProcessEvent, ProcessFailed
from pie_core.client.sync import SyncClient, SyncProcess, connect_sync

__all__ = [
    "Client",
    "McpHandler",
    "ServerError",
    "connect",
    "pack_program",
    "Process",
    "ProcessEvent",
    "ProcessFailed",
    "SyncClient",
    "SyncProcess",
    "connect_sync",
]
