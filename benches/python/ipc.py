#!/usr/bin/env python3
"""A GPU tensor handed to another process: tensorbridge's share/open next to
torch.multiprocessing's sharing of the same tensor and to a copy through pinned host memory,
for sizes from 4 KiB to 1 GiB.

This process is the producer; a spawned process (a fresh interpreter, torch and tensorbridge
imported and CUDA initialised before anything is timed) is the consumer. Per size and path,
ROUNDS rounds on a fresh tensor each (allocating it is not timed):

- tensorbridge: producer `pickle.dumps(tb.share(x))` (handle creation); consumer
  `tb.open(pickle.loads(data))` (open), then `torch.from_dlpack(view)[0].item()` (first use:
  the consumer's framework takes the memory and reads it, which waits for the device; the
  `torch.from_dlpack` part alone is also kept, as `first_use_wrap_us` in the JSON);
- torch.multiprocessing: producer `ForkingPickler.dumps(x)` (its `reduce_tensor`: the IPC
  handles of the caching allocator's block, an event, a ref-counter slot); consumer
  `pickle.loads(data)` (its `rebuild_cuda_tensor`), then `y[0].item()`;
- pinned host copy: a pinned buffer in shared memory (`multiprocessing.shared_memory`,
  `cudaHostRegister` in both processes, set up once); producer copies the tensor into it and
  synchronises; consumer copies it into its own device tensor and synchronises (its first
  use is then free).

Medians in microseconds; the table is printed (then tensorbridge's first use and total next to
torch.multiprocessing's, size by size, with their ratio) and written to $OUT/ipc.json. The bundle's
bench.sh runs it. Host pinning: bench.sh's `taskset` holds both processes to one core.
"""

import json
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
ROUNDS = {4 << 10: 50, 64 << 10: 50, 1 << 20: 30, 16 << 20: 20, 256 << 20: 8, 1 << 30: 5}


def consumer(conn, shm_name, max_bytes):
    import torch

    import tensorbridge as tb
    from multiprocessing import shared_memory

    torch.zeros(1, device="cuda")
    shm = shared_memory.SharedMemory(name=shm_name)
    staging = torch.frombuffer(shm.buf, dtype=torch.uint8)
    rc = torch.cuda.cudart().cudaHostRegister(staging.data_ptr(), max_bytes, 0)
    assert int(rc) == 0, f"cudaHostRegister: {rc}"
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, payload = msg
        t0 = time.perf_counter()
        t_wrap = None
        if kind == "tb":
            v = tb.open(pickle.loads(payload))
            t1 = time.perf_counter()
            y = torch.from_dlpack(v)
            t_wrap = time.perf_counter() - t1
            y[0].item()
        elif kind == "torch":
            y = pickle.loads(payload)
            t1 = time.perf_counter()
            y[0].item()
        else:  # pinned copy
            n = payload
            y = torch.empty(n, dtype=torch.uint8, device="cuda")
            t0 = time.perf_counter()
            y.copy_(staging[:n], non_blocking=True)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
        t2 = time.perf_counter()
        del y
        if kind == "tb":
            del v
        conn.send((t1 - t0, t2 - t1, t_wrap))
    torch.cuda.cudart().cudaHostUnregister(staging.data_ptr())
    del staging
    shm.close()


def side_by_side(rows):
    """tensorbridge next to torch.multiprocessing per size: first use and total, each with
    tensorbridge's time over torch's (below 1: tensorbridge is faster)."""
    by = {(r["bytes"], r["path"]): r for r in rows}
    lines = [
        "| size | first use, tensorbridge (us) | first use, torch.multiprocessing (us) | ratio "
        "| total, tensorbridge (us) | total, torch.multiprocessing (us) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in SIZES:
        tb, mp_ = by.get((size, "tensorbridge")), by.get((size, "torch.multiprocessing"))
        if tb is None or mp_ is None:
            continue
        cells = [f"{size}"]
        for key in ("first_use_us", "total_us"):
            ratio = tb[key] / mp_[key] if mp_[key] > 0 else float("nan")
            cells += [f"{tb[key]:.1f}", f"{mp_[key]:.1f}", f"{ratio:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    import torch
    from multiprocessing import shared_memory
    from multiprocessing.reduction import ForkingPickler

    import tensorbridge as tb

    if not torch.cuda.is_available():
        print("ipc.py: no CUDA device, nothing to measure")
        return
    torch.zeros(1, device="cuda")
    max_bytes = max(SIZES)
    shm = shared_memory.SharedMemory(create=True, size=max_bytes)
    staging = torch.frombuffer(shm.buf, dtype=torch.uint8)
    rc = torch.cuda.cudart().cudaHostRegister(staging.data_ptr(), max_bytes, 0)
    assert int(rc) == 0, f"cudaHostRegister: {rc}"
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=consumer, args=(there, shm.name, max_bytes), daemon=True)
    proc.start()
    assert here.recv() == "ready"
    rows = []
    try:
        for size in SIZES:
            times = {p: ([], [], [], []) for p in ("tensorbridge", "torch.multiprocessing", "pinned copy")}
            for r in range(ROUNDS[size] + 1):  # round 0 warms every path up
                for path in times:
                    x = torch.full((size,), r % 251 + 1, dtype=torch.uint8, device="cuda")
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    if path == "tensorbridge":
                        h = tb.share(x)
                        msg = ("tb", pickle.dumps(h))
                    elif path == "torch.multiprocessing":
                        msg = ("torch", bytes(ForkingPickler.dumps(x)))
                    else:
                        staging[:size].copy_(x, non_blocking=True)
                        torch.cuda.synchronize()
                        msg = ("pinned", size)
                    t_share = time.perf_counter() - t0
                    here.send(msg)
                    t_open, t_first, t_wrap = here.recv()
                    if r:
                        times[path][0].append(t_share)
                        times[path][1].append(t_open)
                        times[path][2].append(t_first)
                        if t_wrap is not None:
                            times[path][3].append(t_wrap)
                    h = None
                    del x
            for path, (share, open_, first, wrap) in times.items():
                row = {
                    "bytes": size,
                    "path": path,
                    "share_us": statistics.median(share) * 1e6,
                    "open_us": statistics.median(open_) * 1e6,
                    "first_use_us": statistics.median(first) * 1e6,
                }
                if wrap:
                    # tensorbridge's first use, its first part: `torch.from_dlpack(view)` alone
                    # (the rest is the read, which waits for the device).
                    row["first_use_wrap_us"] = statistics.median(wrap) * 1e6
                row["total_us"] = row["share_us"] + row["open_us"] + row["first_use_us"]
                rows.append(row)
                print(f"{size:>11} B  {path:<22} share {row['share_us']:>10.1f} us  "
                      f"open {row['open_us']:>10.1f} us  first use {row['first_use_us']:>10.1f} us  "
                      f"total {row['total_us']:>10.1f} us", flush=True)  # fmt: skip
    finally:
        here.send(None)
        proc.join(60)
        torch.cuda.cudart().cudaHostUnregister(staging.data_ptr())
        del staging
        shm.close()
        shm.unlink()
    print()
    print("| size | path | handle creation (us) | open (us) | first use (us) | total (us) |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['bytes']} | {row['path']} | {row['share_us']:.1f} | {row['open_us']:.1f} "
              f"| {row['first_use_us']:.1f} | {row['total_us']:.1f} |")  # fmt: skip
    print()
    print(side_by_side(rows))
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "ipc.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
