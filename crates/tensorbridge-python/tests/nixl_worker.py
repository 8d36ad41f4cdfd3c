"""The other process of the NIXL tests (``test_nixl.py``, ``gpu/test_gpu_nixl.py``).

``python nixl_worker.py NAME FRAMEWORK DEVICE``: makes a NIXL agent named NAME (UCX backend)
and answers one JSON command per line on stdin with one JSON line on stdout (bytes travel
as base64). FRAMEWORK (numpy, torch, cupy, jax) allocates this side's tensors on DEVICE
("cpu" or "cuda:N"); every tensor of a command is a slice of one buffer, so that the
registration is one descriptor. Commands:

- ``{"op": "recv", "n": N, "k": K, "dtype": D}``: N zeroed tensors of K elements, registered;
  answers the description, the descriptor count, the tensors CUDA IPC cannot share
  (``Registration.staged``), this agent's metadata.
- ``{"op": "send", "n": N, "k": K, "dtype": D, "start": S}``: N tensors holding S, S+1, ...
  in element order, registered; answers as ``recv``.
- ``{"op": "peer", "md": ...}``: adds a remote agent; answers its name.
- ``{"op": "wait", "peer": P, "tag": T}``: waits for P's notification T; answers the values
  (a SHA-256 digest of the bytes, and the values themselves when there are few).
- ``{"op": "write_busy", ...}``, ``{"op": "describe_busy", ...}``: PyTorch on a GPU only:
  ``Side.write_busy``, ``Side.describe_busy``.
- ``{"op": "read", "peer": P, "remote": R, "tag": T, "jax": J}``: READs R from P into this
  side's ``recv`` tensors, notifying T; answers the values (read through JAX when J).
- ``{"op": "dereg"}``, ``{"op": "exit"}``.
"""

import base64
import hashlib
import importlib.util
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


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class Side:
    def __init__(self, name: str, framework: str, device: str) -> None:
        self.framework = framework
        self.device = device
        if device.startswith("cuda") and framework == "torch":
            import torch

            torch.cuda.set_device(torch.device(device))
        elif device.startswith("cuda") and framework == "cupy":
            import cupy

            cupy.cuda.Device(int(device.split(":")[1])).use()
        self.agent = tbn.make_agent(name)
        self.buffer = None
        self.tensors = []
        self.reg = None

    def alloc(self, n: int, k: int, dtype: str, start=None):
        total = n * k
        host = np.zeros(total, dtype) if start is None else (np.arange(total) + start).astype(dtype)
        fw = self.framework
        if fw == "jax" and start is None:
            # JAX arrays are immutable: a JAX consumer receives into memory of its own (CuPy's,
            # else PyTorch's on the GPU; NumPy's on the host) and takes it through DLPack
            # afterwards (``values``), as the README's recipe does.
            fw = "cupy" if self.device.startswith("cuda") and _has("cupy") else (
                "torch" if self.device.startswith("cuda") else "numpy"
            )
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
        # A peer READs this memory with nothing ordering it after this process's GPU work
        # (NIXL cannot: docs/NIXL.md), so the work that filled it is finished first.
        if fw == "torch" and self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(torch.device(self.device))
        elif fw == "cupy":
            import cupy

            cupy.cuda.Device(int(self.device.split(":")[1])).synchronize()
        self.buffer = buf
        if fw == "jax":  # a sending JAX side
            # One JAX array; its slices would be new buffers. One tensor, one descriptor.
            self.tensors = [buf]
        else:
            self.tensors = [buf[i * k : (i + 1) * k] for i in range(n)]
        self.reg = tbn.register(self.agent, self.tensors, allow_readonly=start is not None)
        remote = tbn.describe(self.tensors)
        return {
            "remote": b64(bytes(remote)),
            "count": self.reg.count,
            "staged": self.reg.staged,
            "md": b64(self.agent.get_agent_metadata()),
        }

    def host(self):
        """This side's buffer on the host, read through its framework (JAX: through DLPack)."""
        if self.framework == "jax":
            import jax

            buf = self.buffer if isinstance(self.buffer, jax.Array) else jax.dlpack.from_dlpack(self.buffer)
            return np.asarray(buf)
        if isinstance(self.buffer, np.ndarray):
            return self.buffer
        if type(self.buffer).__module__.startswith("torch"):
            return self.buffer.cpu().numpy()
        return self.buffer.get()

    def values(self):
        host = self.host()
        out = {"digest": hashlib.sha256(np.ascontiguousarray(host).tobytes()).hexdigest()}
        if host.size <= 1 << 14:
            out["values"] = [float(x) for x in host]
        return out

    def describe_busy(self, cmd):
        """PyTorch on the GPU: this side's buffer rewritten after ``busy_ms`` of device work
        on a stream of its own, then described at once (``describe`` waits for that work),
        for a peer to READ."""
        import torch

        dev = torch.device(self.device)
        khz = getattr(torch.cuda.get_device_properties(dev), "clock_rate", 0) or 2_000_000
        final = torch.arange(self.buffer.numel(), device=dev, dtype=self.buffer.dtype) * -1.0
        torch.cuda.synchronize(dev)
        with torch.cuda.device(dev), torch.cuda.stream(torch.cuda.Stream(dev)):
            torch.cuda._sleep(int(khz * cmd["busy_ms"]))
            self.buffer.copy_(final)
            remote = tbn.describe(self.tensors)
        fin = final.cpu().numpy()
        return {"remote": b64(bytes(remote)), "final_digest": hashlib.sha256(fin.tobytes()).hexdigest()}

    def write_busy(self, cmd):
        """PyTorch on the GPU: the buffer's final values written after ``busy_ms`` of device
        work on the current stream, then a WRITE posted at once: through ``tbn.transfer``
        (ordered after that work) or, with ``ordered`` false, through NIXL by hand (the
        control: nothing waits)."""
        import torch

        dev = torch.device(self.device)
        khz = getattr(torch.cuda.get_device_properties(dev), "clock_rate", 0) or 2_000_000
        final = torch.arange(self.buffer.numel(), device=dev, dtype=self.buffer.dtype) * -1.0
        remote = tbn.Remote.from_bytes(unb64(cmd["remote"]))
        tag = cmd["tag"].encode()
        local = self.agent.get_xfer_descs(tbn.xfer_descs(self.tensors).array, "VRAM")
        far = self.agent.get_xfer_descs(remote.descs.array, remote.mem_type)
        torch.cuda.synchronize(dev)
        # The producer's work on a stream of its own (PyTorch's current stream inside the
        # block), the transfer posted from inside the block, as a producer would.
        with torch.cuda.device(dev), torch.cuda.stream(torch.cuda.Stream(dev)):
            torch.cuda._sleep(int(khz * cmd["busy_ms"]))
            self.buffer.copy_(final)
            if cmd["ordered"]:
                x = tbn.transfer(self.agent, "WRITE", self.tensors, remote, cmd["peer"], notif=tag)
                with x:
                    x.wait(timeout=30)
            else:
                h = self.agent.initialize_xfer("WRITE", local, far, cmd["peer"], tag)
                state = self.agent.transfer(h)
                while state == "PROC":
                    state = self.agent.check_xfer_state(h)
                self.agent.release_xfer_handle(h)
        torch.cuda.synchronize(dev)
        fin = final.cpu().numpy()
        return {"final_digest": hashlib.sha256(fin.tobytes()).hexdigest()}

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
            return self.values()
        if op == "write_busy":
            return self.write_busy(cmd)
        if op == "describe_busy":
            return self.describe_busy(cmd)
        if op == "read":
            tag = cmd.get("tag", "").encode()
            x = tbn.transfer(
                self.agent, "READ", self.tensors, unb64(cmd["remote"]), cmd["peer"], notif=tag
            )
            with x:
                x.wait(timeout=30)
            if cmd.get("jax"):
                # The README's recipe: the received buffer handed to JAX through DLPack.
                import jax

                y = jax.dlpack.from_dlpack(self.buffer)
                return {"values": [float(v) for v in np.asarray(y)], "pieces": x.pieces}
            return {**self.values(), "pieces": x.pieces}
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
