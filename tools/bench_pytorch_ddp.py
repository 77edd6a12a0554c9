#!/usr/bin/env python3
"""PyTorch baseline for `diffusion bench --gpus N`: the official DiT (tools/dit_reference.py)
trained data parallel with DistributedDataParallel, one process per GPU, as the official
train.py trains it: bf16 autocast, TF32 matmuls, fused AdamW (lr 1e-4, no weight decay), the
official loss (mse + vb), EMA 0.9999 after every step. Synthetic, seeded data; --batch images
per GPU, as DDP counts a batch. Timing and memory as tools/bench_pytorch.py's train workload
(its Bench.measure: the median of --repeats runs of --iters steps after --warmup steps,
torch.compile compiling during the warm-up; peak allocated GPU memory over the timed steps).

Rank 0 prints the total img/s of all GPUs (the slowest rank's step time), per GPU img/s and
TFLOP/s, and the largest rank's peak memory. Run it under torchrun:

    torchrun --standalone --nproc_per_node 2 tools/bench_pytorch_ddp.py --model DiT-XL/2 --mode compile
"""
import argparse
import copy
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(__file__))
import bench_pytorch as B  # noqa: E402  (the single-GPU benchmark: config, FLOP count, timing)

R = B.R  # tools/dit_reference.py


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="DiT-XL/2", help="demo or an official name (default DiT-XL/2)")
    ap.add_argument("--input-size", type=int, default=32, help="latent side (32: 256 px images)")
    ap.add_argument("--batch", type=int, default=64, help="images per GPU per step")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: default)")
    ap.add_argument("--iters", type=int, default=10, help="steps per timed repeat")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiling, with --mode compile)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="rank 0 writes the result to this file")
    a = ap.parse_args()
    a.amp = "bf16"  # what B.Bench.autocast reads
    return a


def main():
    a = parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit("bench_pytorch_ddp: run it under torchrun (torchrun --standalone --nproc_per_node N ...)")
    dist.init_process_group("nccl")
    rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = True  # as the official train.py
    torch.backends.cudnn.allow_tf32 = True
    cfg = B.DEMO if a.model == "demo" else R.config_from_name(a.model, input_size=a.input_size)
    bench = B.Bench(a, cfg, dev)

    # Every rank builds the same model (same seed), as DDP's first broadcast would make it.
    model = R.build_model(cfg, seed=a.seed, device=dev, fused_attn=True)
    model.train()  # label dropout on, as train.py
    ema = copy.deepcopy(model).requires_grad_(False)
    ema_p, model_p = list(ema.parameters()), list(model.parameters())
    ddp = DDP(model, device_ids=[local])
    run = torch.compile(ddp, mode=a.compile_mode) if a.mode == "compile" else ddp
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0, fused=True)
    diffusion, _ = R.create_diffusion("")
    torch.manual_seed(a.seed + 1 + rank)  # each rank its own synthetic data
    x0 = torch.rand((a.batch, cfg.in_channels, cfg.input_size, cfg.input_size), device=dev) * 2 - 1
    y = torch.randint(0, cfg.num_classes, (a.batch,), device=dev)
    net = lambda x, t, yy: run(x, t, yy).float()  # noqa: E731  (the loss in float32)

    def step():
        t = torch.randint(0, diffusion.num_timesteps, (a.batch,), device=dev)
        with bench.autocast():
            loss = diffusion.training_losses(net, x0, t, y)["loss"].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients (averaged over ranks) here
        opt.step()
        with torch.no_grad():  # update_ema: ema = decay * ema + (1 - decay) * param
            torch._foreach_lerp_(ema_p, model_p, 1 - B.EMA_DECAY)

    sec, peak = bench.measure(step, a.iters)
    # the slowest rank sets the pace; memory is quoted for the rank that needs the most
    r = torch.tensor([sec, peak], dtype=torch.float64, device=dev)
    dist.all_reduce(r, op=dist.ReduceOp.MAX)
    sec, peak = r.tolist()
    if rank == 0:
        res = dict(torch=torch.__version__, device=torch.cuda.get_device_name(dev), model=a.model, mode=a.mode,
                   gpus=world, batch_per_gpu=a.batch, iters=a.iters, warmup=a.warmup, repeats=a.repeats,
                   img_s=a.batch * world / sec, img_s_per_gpu=a.batch / sec, ms=sec * 1e3,
                   tflops_per_gpu=3 * bench.fwd_flop * a.batch / sec / 1e12, peak_gib=peak)
        print(f"ddp     {a.model} {a.mode} on {world} GPU{'s' if world > 1 else ''} ({res['device']}, torch "
              f"{res['torch']}): batch {a.batch} per GPU   {res['img_s']:.1f} img/s total   "
              f"{res['img_s_per_gpu']:.1f} img/s per GPU   {res['ms']:.1f} ms/step   "
              f"{res['tflops_per_gpu']:.1f} TFLOP/s per GPU   peak GPU {peak:.2f} GiB (max over ranks)", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
