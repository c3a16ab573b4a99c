#!/usr/bin/env python3
"""The host-offloaded AdamW of a device run (parallel.offload = "cpu" or "nvme" on CUDA,
optim/host_offload.h), its logic run on CPU ranks: PENTAD_HOST_ADAMW=1 makes a CPU run take
that path, where every device copy is a host copy. Each bucket's reduced gradients come down
as soon as its reduction of the step's last micro-batch is done, and the step clips every
chunk's gradients on the host (optim.grad_clip = 0.05, so that every step clips).

For dp2 without ZeRO (all-reduce in the gradient arena), zero 1, zero 2 with grad_accum 2
(every micro-batch reduces; the step must see the last one's sums), zero 3 with the state and the
parameter shares on NVMe, and MoE dp2 x ep2 at zero 2 (the experts' shares after the dense
ones in the optimizer's shard): 6 losses and the final weights bitwise equal to the same run
updating in place, and every chunk of the last step took the gradients brought down during
backward (the end-of-run line says how many).

usage: host_adamw.py PENTAD RECIPE_DIR WORKDIR
"""
import re
import shutil
import sys
from pathlib import Path

from zero_offload import ENV, check, failures, losses, same_weights, train


def main():
    pentad, recipes, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "offload").mkdir()
    nvme = [f"parallel.offload_path={work / 'offload'}", "parallel.nvme_subgroup_kb=64",
            "parallel.offload=nvme"]
    common = ["train.steps=6", "optim.grad_clip=0.05"]
    gpt, moe = str(recipes / "gpt-tiny.toml"), str(recipes / "moe-fine-tiny.toml")
    for name, recipe, ranks, layout, offload in [
            ("dp2", gpt, 2, [], ["parallel.offload=cpu"]),
            ("dp2-zero1", gpt, 2, ["parallel.zero=1"], ["parallel.offload=cpu"]),
            ("dp2-zero2-accum2", gpt, 2, ["parallel.zero=2", "train.grad_accum=2"],
             ["parallel.offload=cpu"]),
            ("dp2-zero3-nvme", gpt, 2, ["parallel.zero=3", "train.grad_accum=2"], nvme),
            ("moe-dp2xep2-zero2", moe, 4, ["parallel.ep=2", "parallel.zero=2"],
             ["parallel.offload=cpu"])]:
        plain, hosted = work / f"{name}-in-place", work / f"{name}-host"
        train(pentad, recipe, ranks, plain, common + layout)
        _, log, _ = train(pentad, recipe, ranks, hosted, common + layout + offload,
                          env=dict(ENV, PENTAD_HOST_ADAMW="1"))
        check(len(losses(plain)) == 6 and losses(plain) == losses(hosted),
              f"{name}: 6 losses bitwise equal through the host's AdamW")
        check(same_weights(plain, hosted), f"{name}: final weights bitwise equal")
        used = re.search(r"host AdamW \(rank 0\): (\d+) of the last step's (\d+) chunks", log)
        check(used is not None and int(used[2]) > 0 and used[1] == used[2],
              f"{name}: every chunk took the gradients brought down during backward "
              f"({used[0] if used else 'no report'})")
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)
    print("host AdamW trains exactly")


if __name__ == "__main__":
    main()
