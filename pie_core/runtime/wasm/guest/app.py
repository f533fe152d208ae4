"""The component's export: ``run(input)`` runs the inferlet mounted at ``/inferlet``.

componentize-py imports this module when it builds the component, so the SDK and the modules
of :data:`pie_guest.stdlib.PRELOAD` are imported once, at build time, and every instance
starts from that snapshot. The rest of the standard library is imported at run time from
``/python``, which the build exports (:mod:`pie_guest.stdlib`); a module the sandbox cannot
have fails with a one-line reason (:mod:`pie_guest.unavailable`).
"""

import os

import wit_world

from pie_guest import stdlib, unavailable

stdlib.export_if_asked(os.path.dirname(__file__))  # the staged folder is mounted here at build time
stdlib.preload()
unavailable.install()

import inferlet  # noqa: E402,F401 - imported at build time, into the snapshot
from pie_guest import runner  # noqa: E402


class WitWorld(wit_world.WitWorld):
    def run(self, input: str) -> str:
        return runner.run(input)
