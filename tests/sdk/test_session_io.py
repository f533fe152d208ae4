import asyncio
import sys

from inferlet import session
from pie_core.host.binding import HostInstance
from pie_core.runtime.instance import run_main


def test_receive_receive_file_send_file_and_stderr_events(dummy):
    async def main(_):
        print("progress note", file=sys.stderr)
        text = await session.receive()
        blob = await session.receive_file()
        session.send_file(blob[::-1])
        return text

    async def go():
        events = []
        inst = HostInstance(engine=dummy.engine, emit=events.append)
        inst.inbox.put_nowait("from the client")
        inst.files.put_nowait(b"\x00\x01\x02")
        final = await run_main(dummy.engine, main, {}, events.append, instance=inst)
        return final, events

    final, events = asyncio.run(go())
    assert final.value == "from the client"
    kinds = [(e.kind, e.value) for e in events]
    assert ("stderr", "progress note") in kinds
    assert ("file", b"\x02\x01\x00") in kinds
    assert kinds[-1] == ("return", "from the client")
