"""NCCL collectives between the GPUs of one node at activation sizes (run under torch.distributed.run on the
GPU machine; calibrate twogpu starts it): all-reduce, all-to-all and a point-to-point send of bf16 tokens x
hidden, median of 20 timed calls after 5 warm-up calls, CUDA events. Writes one JSON (rank 0)."""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def timed(fn, reps: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)  # us
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--tokens", default="1,8,64,256,1024,8192")
    a = p.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    rows = []
    for tokens in [int(t) for t in a.tokens.split(",")]:
        x = torch.randn(tokens * a.hidden, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        nbytes = x.numel() * 2
        ar = timed(lambda x=x: dist.all_reduce(x))
        a2a = timed(lambda x=x, y=y: dist.all_to_all_single(y, x)) if x.numel() % world == 0 else None

        def p2p(x=x):
            (dist.send if rank == 0 else dist.recv)(x, 1 - rank)
        send = timed(p2p) if world == 2 else None
        rows.append({"tokens": tokens, "bytes": nbytes, "allreduce_us": round(ar, 2),
                     "allreduce_busbw_gb_s": round(2 * (world - 1) / world * nbytes / ar / 1e3, 1),
                     "alltoall_us": None if a2a is None else round(a2a, 2),
                     "send_us": None if send is None else round(send, 2)})
        if rank == 0:
            print(json.dumps(rows[-1]), flush=True)
    if rank == 0:
        info = {"world": world, "device": torch.cuda.get_device_name(), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "torch": torch.__version__, "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
        with open(a.out, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
