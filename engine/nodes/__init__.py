"""Node streaming: every node's ranks and GPUs in node 0's one events.jsonl (issue 31).

Events travel one way, per rank, then per node:

    rank --pipe--> its node's supervisor --ZeroMQ PUSH/PULL--> node 0's supervisor --> events.jsonl

- Each rank has its own pipe to its node's supervisor (engine/launch/channel.py; read by
  engine/launch/ranks.py EventReader): a rank killed mid-send loses at most its own last event.
- Each node's supervisor samples its GPUs (NVML) and host (psutil) once a second
  (sampler.NodeSampler, engine/sources) into `node_sample` events (multi-node runs only).
- Each non-zero node's supervisor (link.Sender) sends its ranks' events, its samples, its stacks
  dumps and its ranks' exits over one connection to node 0's supervisor (link.Receiver), which
  puts them in its EventWriter's queue; they gain node_rank and host when they lack them. The
  node keeps writing its own events.jsonl too: a node that cannot reach node 0 still has all
  of its events, and says so in a log event.
- Never through the ranks' process group: it keeps flowing while a rank stalls or is dead, and
  it works for a user's own script as for torchdeck's loop.

Where: node 0 listens on the rendezvous host (nodes.master_addr, or the tcp:// init method's
host), bound as the rendezvous store is (engine/network.py store_address: only that address when
it is one of node 0's), on the rendezvous port + 1 (env TORCHDECK_NODE_PORT overrides it).

The secret: env TORCHDECK_NODE_SECRET, the same on every node of the run (`torchdeck export
--sbatch` makes one per job inside the job script when it runs). Unset on node 0: it generates
one into RUN_DIR/node.key (mode 0600, only its owner reads it) and says how to pass it on.
Unset on another node: that node keeps its events to itself and says so. The supervisor takes
the variable out of its environment before it starts the ranks (the user's script never sees it).
"""
from __future__ import annotations

ENV_SECRET = "TORCHDECK_NODE_SECRET"
ENV_PORT = "TORCHDECK_NODE_PORT"
PORT_OFFSET = 1  # the node port: the rendezvous port + 1
