"""Scale-out across processes and machines: each replica's backend in a Ray actor
(``pie serve --ray``), driven by the engine's own worker, batcher and placement.

Importing this package does not import Ray; :func:`connect` and :func:`start_ray_replicas` do,
and say what to install when it is missing.
"""

from pie_core.scaleout.ray_backend import BackendActor
from pie_core.scaleout.ray_calls import RayCalls, actor_resources, start_ray_replicas
from pie_core.scaleout.ray_cluster import MISSING_RAY, connect, import_ray

__all__ = ["BackendActor", "MISSING_RAY", "RayCalls", "actor_resources", "connect", "import_ray", "start_ray_replicas"]
