"""The serving data path: `/serve/` requests proxied on the gateway's own HTTP protocol.

`connections.SlowClientProtocol` hands a request whose path is `/serve/{target}/...` to
`ServeDataPlane` (proxy.py) instead of the API application: the router's decisions, the
bytes over pooled keep-alive connections to the replicas (upstream.py), the pure parts in
wire.py. `HETEROFLOW_SERVE_DATAPLANE=false` sends them through the API application and
httpx as before (routes_serve.py). docs/serving.md, "The data path".
"""

from .proxy import ClientWatch, ServeDataPlane

__all__ = ["ClientWatch", "ServeDataPlane"]
