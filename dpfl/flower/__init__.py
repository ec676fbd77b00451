"""dpfl on Flower's deployment runtime (SuperLink, SuperNodes, `flwr run`).

    dpfl.flower.server:app   the ServerApp: a `coordinator.Coordinator` over Flower's Grid
    dpfl.flower.client:app   the ClientApp: one client's training, client chain and its side
                             of the secure sum (`party.Party`)
    wire                     the records the messages carry
    worker, site             a site's training process, kept alive between Flower messages
    loopback                 the same handlers in process (tests, dry runs)
    appdir, certs, local     the Flower App for a config, TLS, node keys and peers.toml, a local federation
    launcher                 a quicker `flwr-clientapp` for the SuperNodes' PATH
    (commands: `dpfl flower certs | app | launcher | local` in dpfl/cli/flower.py; `dpfl bench flower` in
    dpfl/bench/flower.py)

See docs/deployment.md. Importing this package imports nothing heavy: a ClientApp process
loads only what its message needs.
"""

import time

STARTED = time.time()  # when dpfl.flower began to load: in a ClientApp process, the end of Flower's launch
