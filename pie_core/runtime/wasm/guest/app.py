"""The component's export: ``run(input)`` runs the inferlet mounted at ``/inferlet``.

componentize-py imports this module when it builds the component, so the SDK is imported
once, at build time, and every instance starts from that snapshot.
"""

import wit_world

import inferlet  # noqa: F401 - imported at build time, into the snapshot
from pie_guest import runner


class WitWorld(wit_world.WitWorld):
    def run(self, input: str) -> str:
        return runner.run(input)
