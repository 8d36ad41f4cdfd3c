#!/usr/bin/env python3
"""Tensors from one GPU to another through NIXL, two processes: tensorbridge's NIXL adapter
(``tensorbridge.nixl``) against hand-written NIXL registration of the same tensors and against
``torch.distributed`` send/recv (NCCL) between the same two GPUs.

Process 0 (the producer, cuda:0) holds the tensors; process 1 (the consumer, cuda:1) receives
them into tensors of its own. Two cases:

- ``1 GiB``: one float32 tensor of 1 GiB;
- ``1000 x 64 KiB``: 1,000 tensors of 64 KiB, slices of one buffer (KV-cache blocks, say).

Paths, each timed on the consumer (median of ROUNDS, after one warm-up round):

- ``tensorbridge``: ``tbn.register`` on both sides (one descriptor per allocation: 1 for the
  1,000 slices), ``tbn.describe`` sent once; per round ``tbn.transfer(.., "READ", ..)`` and
  ``wait`` (descriptor lists built, request created, posted, done);
- ``NIXL by hand``: ``agent.register_memory(list_of_tensors)`` on both sides (NIXL's own torch
  path: one descriptor per tensor), ``(ptr, nbytes, dev)`` per tensor sent once; per round
  ``initialize_xfer(get_xfer_descs(...))``, ``transfer`` and polling until done;
- ``NCCL``: per round ``dist.send`` / ``dist.recv`` of each tensor, batched
  (``batch_isend_irecv``) for the 1,000, then ``torch.cuda.synchronize`` on the consumer.

Registration times (both sides' first registration) and descriptor counts are reported too.
The table is printed and written to $OUT/nixl.json. Needs two GPUs, torch, NIXL
(``pip install --no-deps nixl-cu13==1.5.1``) and the tensorbridge wheel; skips, saying so,
without them. The bundle's bench.sh runs it with ``UCX_NET_DEVICES=lo``.
"""

import json
import multiprocessing as mp
import os
import statistics
import sys
import time

ROUNDS = {"1000 x 64 KiB": 30, "1 GiB": 10}
CASES = {"1000 x 64 KiB": (1000, 1 << 14), "1 GiB": (1, 1 << 28)}  # (tensors, float32 each)
# A worker that has not finished by then prints every thread's stack and exits (a failure,
# never a hang); each transfer has its own limit too.
WORKER_LIMIT_S = float(os.environ.get("TB_NIXL_BENCH_LIMIT", "240"))
XFER_LIMIT_S = 60.0


def say(rank, *what):
    print(f"[rank {rank} {time.strftime('%H:%M:%S')}]", *what, flush=True)


def tensors(torch, case, device, fill):
    n, k = CASES[case]
    buf = torch.empty(n * k, dtype=torch.float32, device=device)
    if fill:
        buf.copy_(torch.arange(n * k, device=device, dtype=torch.float32))
    else:
        buf.zero_()
    return buf, list(buf.split(k))


class Case:
    """One case's tensors in one worker: tensorbridge's path's buffer and parts, NIXL by hand's
    own (the same shapes, the same allocator), both registrations, and the result row."""

    def __init__(self, torch, case, device, fill):
        self.buf, self.parts = tensors(torch, case, device, fill)
        self.hbuf, self.hparts = tensors(torch, case, device, fill)
        self.reg = self.hand = None
        self.row = {}


def ms(seconds):
    return round(seconds * 1e3, 3)


def worker(rank, conn, port):
    import faulthandler

    faulthandler.dump_traceback_later(WORKER_LIMIT_S, exit=True)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    import torch
    import torch.distributed as dist

    import tensorbridge.nixl as tbn

    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    agent = tbn.make_agent(f"bench-{rank}")
    other = f"bench-{1 - rank}"
    # Every case's tensors first, each path its own (the same shapes, the same allocator), all
    # registered before the agents trade metadata: a peer knows only the memory registered
    # when it loaded the metadata.
    mine = {}
    for case in CASES:
        c = mine[case] = Case(torch, case, device, fill=rank == 0)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        c.reg = tbn.register(agent, c.parts)
        c.row["tb_register_ms"] = ms(time.perf_counter() - t0)
        c.row["tb_descriptors"] = c.reg.count
        # by hand: NIXL's own torch path, one descriptor per tensor
        t0 = time.perf_counter()
        c.hand = agent.register_memory(c.hparts)
        c.row["hand_register_ms"] = ms(time.perf_counter() - t0)
        c.row["hand_descriptors"] = len(c.hparts)
    # One side sends first: metadata of 1,000 registrations outgrows the pipe's buffer, and
    # two processes both sending first would each wait for the other to read.
    if rank == 0:
        conn.send(agent.get_agent_metadata())
        agent.add_remote_agent(conn.recv())
    else:
        peer_md = conn.recv()
        conn.send(agent.get_agent_metadata())
        agent.add_remote_agent(peer_md)
    say(rank, "registered and introduced:", {case: c.row for case, c in mine.items()})
    results = {}
    for case, c in mine.items():
        buf, parts, hbuf, hparts, row = c.buf, c.parts, c.hbuf, c.hparts, c.row
        if rank == 0:
            conn.send((bytes(tbn.describe(parts)), [(p.data_ptr(), p.numel() * 4, 0) for p in hparts]))
        else:
            blob, remote_list = conn.recv()
            remote = tbn.Remote.from_bytes(blob)
            tb_times, hand_times = [], []
            for r in range(ROUNDS[case] + 1):
                t0 = time.perf_counter()
                with tbn.transfer(agent, "READ", parts, remote, other) as x:
                    x.wait(timeout=XFER_LIMIT_S)
                tb_times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                h = agent.initialize_xfer(
                    "READ", agent.get_xfer_descs(hparts), agent.get_xfer_descs(remote_list, "VRAM"), other
                )
                state = agent.transfer(h)
                while state == "PROC" and time.perf_counter() - t0 < XFER_LIMIT_S:
                    state = agent.check_xfer_state(h)
                agent.release_xfer_handle(h)
                hand_times.append(time.perf_counter() - t0)
                if state != "DONE":
                    raise RuntimeError(f"hand-written transfer ended in {state}")
                if r == 0:
                    say(rank, case, f"first round: tensorbridge {ms(tb_times[0])} ms, by hand {ms(hand_times[0])} ms")
            want = torch.arange(buf.numel(), device=device, dtype=torch.float32)
            row["values_ok"] = bool(torch.equal(buf, want)) and bool(torch.equal(hbuf, want))
            row["tb_transfer_ms"] = ms(statistics.median(tb_times[1:]))
            row["hand_transfer_ms"] = ms(statistics.median(hand_times[1:]))
        conn.send("nixl done") if rank == 1 else conn.recv()
        # NCCL
        nccl_times = []
        for r in range(ROUNDS[case] + 1):
            dist.barrier()
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            ops = [
                dist.P2POp(dist.isend if rank == 0 else dist.irecv, p, 1 - rank) for p in parts
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            torch.cuda.synchronize(device)
            nccl_times.append(time.perf_counter() - t0)
        if rank == 1:
            row["nccl_ms"] = ms(statistics.median(nccl_times[1:]))
            results[case] = row
            say(rank, case, row)
    for c in mine.values():
        c.reg.deregister()
        agent.deregister_memory(c.hand)
    mine.clear()
    torch.cuda.empty_cache()
    if rank == 1:
        conn.send(results)
    dist.destroy_process_group()


def main():
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return
    import tensorbridge.nixl as tbn

    try:
        tbn.import_nixl()
    except ImportError as e:
        print(f"skipped: {e}")
        return
    if torch.cuda.device_count() < 2:
        print(f"skipped: needs two GPUs, found {torch.cuda.device_count()}")
        return
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(0, a, port)), ctx.Process(target=worker, args=(1, b, port))]
    for p in procs:
        p.start()
    # The workers trade metadata over the pipe's two ends themselves; the consumer's last
    # message is the results. A worker that fails leaves the other waiting on the pipe: it
    # is stopped, and the run fails, instead of hanging.
    deadline = time.monotonic() + WORKER_LIMIT_S + 60
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.2)
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join(timeout=30)
    # The results arrive on process 0's end after it exited; read what is left.
    results = a.recv() if a.poll(5) else None
    if results is None or any(p.exitcode for p in procs):
        sys.exit(f"nixl.py: a worker failed (exit codes {[p.exitcode for p in procs]})")
    names = torch.cuda.get_device_name(0), torch.cuda.get_device_name(1)
    print(f"NIXL across two GPUs ({names[0]} -> {names[1]}), medians in ms")
    print(f"{'case':<16}{'tb xfer':>10}{'hand xfer':>11}{'NCCL':>9}{'tb reg':>9}{'hand reg':>10}{'tb descs':>10}{'hand descs':>12}  ok")
    for case, r in results.items():
        print(
            f"{case:<16}{r['tb_transfer_ms']:>10}{r['hand_transfer_ms']:>11}{r['nccl_ms']:>9}"
            f"{r['tb_register_ms']:>9}{r['hand_register_ms']:>10}{r['tb_descriptors']:>10}"
            f"{r['hand_descriptors']:>12}  {r['values_ok']}"
        )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "nixl.json"), "w") as f:
            json.dump({"devices": names, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
