"""What the NIXL tests share (``test_nixl.py``, ``gpu/test_gpu_nixl.py``): NIXL found or the
test skipped (a failure when ``TB_REQUIRE_NIXL=1``, as CI sets where it installs NIXL), the
environment UCX needs on one machine, and ``Peer``, the driver of ``nixl_worker.py`` in
another process."""

import base64
import json
import os
import subprocess
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# UCX's TCP lane on loopback only (the data goes through shared memory / CMA on one machine);
# set before any agent is made, here and in every worker.
os.environ.setdefault("UCX_NET_DEVICES", "lo")


def require_nixl():
    """The NIXL API module, or a skip (a failure with ``TB_REQUIRE_NIXL=1``)."""
    import tensorbridge.nixl as tbn

    try:
        return tbn.import_nixl()
    except (tbn.NixlNotInstalledError, tbn.NixlConflictError) as e:
        if os.environ.get("TB_REQUIRE_NIXL") == "1":
            pytest.fail(f"TB_REQUIRE_NIXL=1, but {e}")
        pytest.skip(f"NIXL not usable here: {e}")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


class Peer:
    """``nixl_worker.py NAME FRAMEWORK DEVICE`` in a child process, one JSON command at a
    time; every answer within ``timeout`` seconds or the test fails (never hangs)."""

    def __init__(self, name, framework, device="cpu", timeout=60.0, env=None):
        self.name = name
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "nixl_worker.py"), name, framework, device],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self._stderr = []
        threading.Thread(target=self._drain, daemon=True).start()
        first = self._answer()
        self.metadata = unb64(first["md"])

    def _drain(self):
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _answer(self):
        result = {}

        def read():
            for line in self.proc.stdout:
                line = line.strip()
                if line.startswith("{"):
                    result["v"] = json.loads(line)
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(self.timeout)
        if "v" not in result:
            self.proc.kill()
            pytest.fail(
                f"worker {self.name}: no answer in {self.timeout} s; stderr:\n"
                + "".join(self._stderr[-40:])
            )
        if "error" in result["v"]:
            pytest.fail(f"worker {self.name}: {result['v']['error']}\n" + "".join(self._stderr[-20:]))
        return result["v"]

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.ask(op="exit")
                self.proc.wait(timeout=self.timeout)
            except BaseException:
                self.proc.kill()
                raise


@pytest.fixture
def peers():
    """``peers(name, framework, device)`` makes a ``Peer`` for the test; every one made is
    closed after it. NIXL found or the test skipped first. The NIXL tests import it as their
    fixture."""
    require_nixl()
    made = []
    yield lambda *a, **k: made.append(Peer(*a, **k)) or made[-1]
    for p in made:
        p.close()
