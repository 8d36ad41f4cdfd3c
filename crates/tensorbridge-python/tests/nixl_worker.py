"""The other process of the NIXL tests (``test_nixl.py``, ``gpu/test_gpu_nixl.py``).

``python nixl_worker.py NAME FRAMEWORK DEVICE``: makes a NIXL agent named NAME (UCX backend)
and answers one JSON command per line on stdin with one JSON line on stdout (bytes travel
as base64). FRAMEWORK (numpy, torch, cupy, jax) allocates this side's tensors on DEVICE
("cpu" or "cuda:N"); every tensor of a command is a slice of one buffer, so that the
registration is one descriptor. Commands:

- ``{"op": "recv", "n": N, "k": K, "dtype": D}``: N zeroed tensors of K elements, registered;
  answers the description, the descriptor count, this agent's metadata.
- ``{"op": "send", "n": N, "k": K, "dtype": D, "start": S}``: N tensors holding S, S+1, ...
  in element order, registered; answers as ``recv``.
- ``{"op": "peer", "md": ...}``: adds a remote agent; answers its name.
- ``{"op": "wait", "peer": P, "tag": T}``: waits for P's notification T; answers the values.
- ``{"op": "read", "peer": P, "remote": R, "tag": T}``: READs R from P into this side's
  ``recv`` tensors; answers the values.
- ``{"op": "dereg"}``, ``{"op": "exit"}``.
"""

import base64
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

import tensorbridge.nixl as tbn  # noqa: E402


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class Side:
    def __init__(self, name: str, framework: str, device: str) -> None:
        self.framework = framework
        self.device = device
        self.agent = tbn.make_agent(name)
        self.buffer = None
        self.tensors = []
        self.reg = None

    def alloc(self, n: int, k: int, dtype: str, start=None):
        total = n * k
        host = np.zeros(total, dtype) if start is None else (np.arange(total) + start).astype(dtype)
        fw = self.framework
        if fw == "numpy":
            buf = host
        elif fw == "torch":
            import torch

            buf = torch.from_numpy(host).to(self.device)
        elif fw == "cupy":
            import cupy

            with cupy.cuda.Device(int(self.device.split(":")[1])):
                buf = cupy.asarray(host)
        elif fw == "jax":
            import jax

            # JAX arrays are immutable: a receiving side writes into memory JAX reads
            # afterwards, which is what the README recipe does; here, JAX only sends.
            dev = jax.devices("gpu" if self.device.startswith("cuda") else "cpu")[
                int(self.device.split(":")[1]) if ":" in self.device else 0
            ]
            buf = jax.device_put(host, dev)
            buf.block_until_ready()
        else:
            raise ValueError(f"framework {fw!r}")
        self.buffer = buf
        if fw == "jax":
            # One JAX array; its slices would be new buffers. One tensor, one descriptor.
            self.tensors = [buf]
        else:
            self.tensors = [buf[i * k : (i + 1) * k] for i in range(n)]
        self.reg = tbn.register(self.agent, self.tensors, allow_readonly=start is not None)
        remote = tbn.describe(self.tensors)
        return {
            "remote": b64(bytes(remote)),
            "count": self.reg.count,
            "md": b64(self.agent.get_agent_metadata()),
        }

    def values(self):
        if self.framework == "numpy":
            host = self.buffer
        elif self.framework == "torch":
            host = self.buffer.cpu().numpy()
        elif self.framework == "cupy":
            host = self.buffer.get()
        else:
            host = np.asarray(self.buffer)
        return [float(x) for x in host]

    def handle(self, cmd):
        op = cmd["op"]
        if op == "recv":
            return self.alloc(cmd["n"], cmd["k"], cmd["dtype"])
        if op == "send":
            return self.alloc(cmd["n"], cmd["k"], cmd["dtype"], cmd["start"])
        if op == "peer":
            name = self.agent.add_remote_agent(unb64(cmd["md"]))
            return {"name": name.decode() if isinstance(name, bytes) else name}
        if op == "wait":
            tbn.wait_notification(self.agent, cmd["peer"], cmd["tag"].encode(), timeout=30)
            return {"values": self.values()}
        if op == "read":
            x = tbn.transfer(self.agent, "READ", self.tensors, unb64(cmd["remote"]), cmd["peer"])
            with x:
                x.wait(timeout=30)
            return {"values": self.values(), "pieces": x.pieces}
        if op == "dereg":
            self.reg.deregister()
            return {}
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    name, framework, device = sys.argv[1:4]
    side = Side(name, framework, device)
    print(json.dumps({"ready": True, "md": b64(side.agent.get_agent_metadata())}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            print(json.dumps({}), flush=True)
            break
        try:
            out = side.handle(cmd)
        except Exception as e:  # noqa: BLE001 - the test reports it
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
