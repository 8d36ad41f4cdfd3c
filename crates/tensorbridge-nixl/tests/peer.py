"""The Python side of the crate's transfer test (``tests/it/transfer.rs``): a NIXL agent
named ``py-target`` with a zeroed NumPy buffer of N float32 registered. Prints one JSON line
(its metadata as hex, the buffer's address), reads the Rust agent's metadata as one hex
line, waits for the notification ``rs-done``, and prints the buffer's values. NumPy and NIXL
only: the test runs before the tensorbridge wheel is built."""

import json
import os
import sys
import time

os.environ.setdefault("UCX_NET_DEVICES", "lo")
import numpy as np  # noqa: E402

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:
    from nixl_cu13._api import nixl_agent, nixl_agent_config

n = int(sys.argv[1])
agent = nixl_agent("py-target", nixl_agent_config(backends=[]))
agent.create_backend("UCX", {})
buf = np.zeros(n, np.float32)
reg = agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
print(json.dumps({"md": agent.get_agent_metadata().hex(), "addr": buf.ctypes.data}), flush=True)
agent.add_remote_agent(bytes.fromhex(sys.stdin.readline().strip()))
deadline = time.monotonic() + 60
while not agent.check_remote_xfer_done("rs-initiator", b"rs-done"):
    if time.monotonic() > deadline:
        sys.exit("no notification from rs-initiator in 60 s")
    time.sleep(0.001)
print(json.dumps({"values": [float(x) for x in buf]}), flush=True)
agent.deregister_memory(reg)
