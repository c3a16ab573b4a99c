#!/usr/bin/env bash
# The GPU benchmark, one command for a GPU session (bench/RESULTS.md, "GPU: how to run the device checks"):
#   bash scripts/gpu_bench.sh SUMMARY_JSON [LOG_DIR]
# Builds (scripts/build.sh), then runs these parts, each under its own time limit, in order
# of importance (when time runs short the last ones are skipped):
#   1. pentad train, GPT-2 124M (recipes/gpt2-124m.toml, vocabulary 50304, random tokens,
#      micro-batch 4 x 8 accumulated = 32768 tokens a step) on the GPU in bf16;
#   2. the PyTorch peer, same model and batch (bench/torch_gpt2.py: bf16 autocast, SDPA,
#      fused AdamW, torch.compile; eager if compiling fails or overruns its limit);
#   3. llm.c's train_gpt2cu, same model and batch (-e d12, random init), when GPU_BENCH_LLMC
#      names a binary built outside pentad (see RESULTS.md). Then it and pentad's GPT-2 runs
#      read the same tokens: one llm.c shard written by bench/make_llmc_shard.py;
#   4. pentad, recipes/llama-1b.toml in bf16 (random tokens), a few steps, with the recipe's
#      recompute ("auto": off where the plan fits) and with it on (pentad_llama1b_bf16_recompute);
#      then LLaMA-1B and GPT-2 again for a few steps with --op-profile: each op's share of the
#      step on the device and the GEMMs' and attention's TFLOP/s (LOG_DIR/*_profile.json);
#   5. pentad GPT-2 124M bf16 again, saving a checkpoint every 10 steps and every step, and
#      every 10 steps with the in-memory level every step between
#      (throughput against no saves, from mean step times);
#   6. build/pentad_gpu_kernels_bench: every CUDA kernel at GPT-2 124M shapes (attention
#      by pentad's kernel and by cuDNN, also at two grouped-query shapes);
#   7. bench/attention_torch.py: PyTorch's SDPA at those attention shapes;
#   8. bench/generate_speed.py --device cuda: decode tokens/s of `pentad generate` (bf16, key/value
#      cache, 256 tokens after a 64-token prompt) next to transformers' generate(use_cache=True)
#      on the same weights and prompt (a plain-PyTorch GPT-2 with a cache where transformers is
#      not installed), alternating, and the fp32 greedy ids of both checked equal;
#   9. pentad, GPT-2 124M in fp32.
# Step times are medians over the steps after a warm-up (pentad: metrics.jsonl's "seconds";
# llm.c: its per-step "ms"; PyTorch: CUDA events). MFU = model FLOP/s, counted as pentad
# counts them (Model::flops_per_micro_batch, which bench/torch_gpt2.py shares), over the
# device's dense bf16 peak (bench/torch_gpt2.py's table; GPU_BENCH_PEAK_TFLOPS overrides).
# Prints a table last; writes every figure, nvidia-smi's report and the commit to
# SUMMARY_JSON, and each part's log to LOG_DIR (default bench/out/gpu-bench): 16 files, 15
# with GPU_BENCH_SKIP_BUILD. The device tool returns at most 8 files from $OUT: pack them
# into one archive there (bench/RESULTS.md shows the command).
#
# Time: the parts' limits add up to about 12 minutes (a run on a fast GPU should take about half
# that); no part starts once GPU_BENCH_DEADLINE_S (default 560) seconds from the start,
# build included, are near, and a part that would run past it gets less time, so one call of
# the device tool (10 minutes at most) holds the script even after a fresh build.
#
# Environment: PYTHON (default python3: the one with PyTorch), PENTAD_COMMIT (where the copy
# has no .git), GPU_BENCH_LLMC (llm.c's train_gpt2cu), GPU_BENCH_PARTS (comma-separated part
# names to run, e.g. pentad_gpt2_bf16,llmc_gpt2; all by default), GPU_BENCH_SKIP_BUILD=1 (use the build
# as it is), GPU_BENCH_SMOKE=1 (checks this script on a machine without a GPU: tiny models
# on the CPU, no build; PENTAD_BUILD_DIR names the build to use).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

summary=${1:?usage: bash scripts/gpu_bench.sh SUMMARY_JSON [LOG_DIR]}
logs=${2:-bench/out/gpu-bench}
mkdir -p "$logs" "$(dirname "$summary")"
logs=$(cd "$logs" && pwd)
runs=$(mktemp -d /tmp/pentad-gpu-bench.XXXXXX)  # run directories, shard, bookkeeping
trap 'rm -rf "$runs"' EXIT
PYTHON=${PYTHON:-python3}
smoke=${GPU_BENCH_SMOKE:-0}
build_dir=${PENTAD_BUILD_DIR:-build}
llmc=${GPU_BENCH_LLMC:-}
deadline=$((SECONDS + ${GPU_BENCH_DEADLINE_S:-560}))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the device runs as root

# Seconds a part may take: its own limit, cut to what is left before the deadline (0: skip).
budget() {
  local left=$((deadline - SECONDS - 10))
  if ((left < 20)); then echo 0; elif (($1 < left)); then echo "$1"; else echo "$left"; fi
}

# part NAME LIMIT_S COMMAND...: runs it under `timeout`, output to LOG_DIR/NAME.log, and
# records "NAME STATUS SECONDS LIMIT" (ok, failed(rc), timeout, skipped) in $runs/parts.
part() {
  local name=$1 limit start rc status
  limit=$(budget "$2")
  shift 2
  printf '%s\n' "$*" >"$runs/$name.cmd"
  if [[ -n ${GPU_BENCH_PARTS:-} && ",$GPU_BENCH_PARTS," != *",$name,"* ]]; then
    skip "$name" "not in GPU_BENCH_PARTS"
    return
  fi
  if ((limit == 0)); then
    echo "gpu_bench: skipping $name: the deadline is near" | tee "$logs/$name.log"
    echo "$name skipped 0 0" >>"$runs/parts"
    return
  fi
  echo "gpu_bench: $name (limit ${limit} s): $*"
  start=$SECONDS
  timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status="failed($rc)" ;;
  esac
  echo "$name $status $((SECONDS - start)) $limit" >>"$runs/parts"
  echo "gpu_bench: $name: $status after $((SECONDS - start)) s (log: $logs/$name.log)"
}

skip() {  # skip NAME WHY
  echo "gpu_bench: $1 skipped: $2" | tee "$logs/$1.log"
  echo "$1 skipped 0 0" >>"$runs/parts"
}

# ---- the machine and the code ----
{
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --format=csv \
      --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit
  else
    echo "no nvidia-smi"
  fi
} >"$runs/nvidia-smi.txt" 2>&1
commit=$(git rev-parse HEAD 2>/dev/null || echo "${PENTAD_COMMIT:-unknown}")
dirty=$(git status --porcelain 2>/dev/null | grep -c . || true)
echo "gpu_bench: commit $commit ($dirty files changed); $(head -1 "$runs/nvidia-smi.txt")"

# ---- what each run is ----
gpt2=(recipes/gpt2-124m.toml --set data.source=random --set model.vocab_size=50304
  --set train.eval_every=0 --set train.save_every=0)
llama=(recipes/llama-1b.toml --set data.source=random --set train.eval_every=0
  --set train.save_every=0)
torch_args=(--measure-gemm)
# llm.c: GPT-2 124M from random weights (-e d12), micro-batch 4 x 1024, 32768 tokens a step
# (8 accumulated), no recompute (pentad's recipe has none), validation only at the first and
# last step (1 batch), no sampling; AdamW as pentad's recipe. bf16 is its build's default.
llmc_args=(-e d12 -b 4 -t 1024 -d 32768 -r 0 -v 100000 -m 1 -s 0 -l 6e-4 -u 0 -q 0 -c 0.1)
shard_args=(--random --tokens 2000000 --vocab 50257 --seed 1)
gpt2_steps=30 gpt2_warmup=5 save1_steps=15 fp32_steps=15 fp32_warmup=3 llama_steps=6 llama_warmup=2
generate_args=(--device cuda --threads 8)
device=cuda bf16=bf16
if ((smoke)); then  # tiny, on the CPU: checks this script, not the GPU
  tiny=(--set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=512
    --set model.max_seq_len=64 --set train.seq_len=64 --set train.micro_batch=2
    --set train.grad_accum=2 --set train.threads=2)
  gpt2+=("${tiny[@]}")
  llama+=("${tiny[@]}" --set model.n_kv_head=2 --set model.d_ff=0)
  torch_args=(--device cpu --layers 2 --width 64 --heads 4 --seq 64 --vocab 512 --micro-batch 2
    --grad-accum 2 --threads 2 --measure-gemm)
  shard_args=(--random --tokens 100000 --vocab 512 --seed 1)
  gpt2_steps=6 gpt2_warmup=2 save1_steps=4 fp32_steps=4 fp32_warmup=1 llama_steps=4 llama_warmup=1
  generate_args=(--device cpu --threads 2 --layers 2 --width 64 --heads 4 --vocab 512
    --new-tokens 32 --short-tokens 8 --repeats 1 --no-cache-tokens 0)
  device=cpu bf16=fp32
  export GPU_BENCH_SKIP_BUILD=1
fi
if [[ -n $llmc ]]; then  # the same tokens for llm.c and pentad's GPT-2 runs
  shard=$runs/shard/random_000000.bin
  if "$PYTHON" bench/make_llmc_shard.py "$shard" "${shard_args[@]}" >"$runs/shard.log" 2>&1; then
    gpt2+=(--set data.source=llmc --set data.path="$shard" --set data.val_path="$shard")
  else
    cat "$runs/shard.log" >&2
    llmc=""
  fi
fi

# ---- build ----
build_start=$SECONDS
if [[ ${GPU_BENCH_SKIP_BUILD:-0} == 1 ]]; then  # the caller built it (and keeps build.log)
  echo "gpu_bench: using $build_dir as it is"
  build_status=skipped
elif bash scripts/build.sh >"$logs/build.log" 2>&1; then
  build_status=ok
else
  build_status=failed
  echo "gpu_bench: the build failed; the end of $logs/build.log:" >&2
  tail -30 "$logs/build.log" >&2
fi
build_seconds=$((SECONDS - build_start))
echo "gpu_bench: build $build_status ($build_seconds s)"
pentad=$build_dir/pentad

# ---- the parts ----
part pentad_gpt2_bf16 60 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$gpt2_steps --set train.out_dir="$runs/gpt2_bf16"

part torch_gpt2 120 "$PYTHON" bench/torch_gpt2.py --steps $((gpt2_steps - gpt2_warmup)) \
  --warmup $gpt2_warmup "${torch_args[@]}"
if ! grep -q '^{' "$logs/torch_gpt2.log"; then  # compiling failed or overran: eager
  mv "$logs/torch_gpt2.log" "$runs/torch_compiled.log"
  part torch_gpt2 45 "$PYTHON" bench/torch_gpt2.py --steps $((gpt2_steps - gpt2_warmup)) \
    --warmup 2 --no-compile "${torch_args[@]}"
  { echo "---- the compiled attempt ----"; cat "$runs/torch_compiled.log"; } \
    >>"$logs/torch_gpt2.log"
fi

if [[ -n $llmc && -x $llmc ]]; then
  part llmc_gpt2 60 "$llmc" -i "$shard" -j "$shard" -x $gpt2_steps "${llmc_args[@]}"
else
  skip llmc_gpt2 "GPU_BENCH_LLMC does not name an llm.c train_gpt2cu binary"
fi

part pentad_llama1b_bf16 75 "$pentad" train "${llama[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$llama_steps --set train.out_dir="$runs/llama_bf16"
# The recipe says model.recompute = "auto", off where the plan fits (a 1B model at 2048
# tokens needs about 20 GiB a rank without it); the same with recompute on: what it costs.
part pentad_llama1b_bf16_recompute 75 "$pentad" train "${llama[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$llama_steps --set model.recompute=true \
  --set train.out_dir="$runs/llama_bf16_recompute"

# Where a step goes, op by op on the device (--op-profile: events around every op, the step's
# time between its first and last; logs/*_profile.json and the table in the part's log). A few
# steps, apart from the throughput runs: the events and the wait at each step's end cost a
# little.
part pentad_llama1b_bf16_profile 45 "$pentad" train "${llama[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=4 --set train.out_dir="$runs/llama_profile" \
  --op-profile "$logs/llama1b_bf16_profile.json"
part pentad_gpt2_bf16_profile 30 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=6 --set train.out_dir="$runs/gpt2_profile" \
  --op-profile "$logs/gpt2_bf16_profile.json"

# Lazy checkpoints of device state: the bf16 GPT-2 run again, saving every 10 steps and every
# step (the newest 2 kept); throughput is the mean step time after the warm-up, against the
# run without saves (a save's cost falls on a few steps and between them, which a median
# of the steps' own times would hide: the ratio takes wall time, metrics' elapsed_seconds).
part pentad_gpt2_bf16_save10 45 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$gpt2_steps --set train.save_every=10 \
  --set train.keep_last=2 --set train.out_dir="$runs/gpt2_save10"
part pentad_gpt2_bf16_save1 45 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$save1_steps --set train.save_every=1 \
  --set train.keep_last=2 --set train.out_dir="$runs/gpt2_save1"
# The in-memory level: a file every 10 steps, a snapshot in host memory (/dev/shm) every step
# between them (checkpoint.memory_every = 1), the copy off the device on its own stream.
part pentad_gpt2_bf16_memory1 45 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=$bf16 --set train.steps=$gpt2_steps --set train.save_every=10 \
  --set checkpoint.memory_every=1 --set train.keep_last=2 --set train.out_dir="$runs/gpt2_memory1"

if [[ -x $build_dir/pentad_gpu_kernels_bench ]] && ((!smoke)); then
  part kernels 75 "$build_dir/pentad_gpu_kernels_bench"  # 41 s on an H200 (2026-11-27)
else
  skip kernels "no $build_dir/pentad_gpu_kernels_bench (or a smoke run)"
fi

if ((!smoke)); then
  part attention_torch 30 "$PYTHON" bench/attention_torch.py
else
  skip attention_torch "a smoke run"
fi

# Decoding: about a minute on an H200 (a CPU training step makes the checkpoint first).
part generate_decode 120 "$PYTHON" bench/generate_speed.py "$pentad" "$runs/generate" \
  "${generate_args[@]}"

part pentad_gpt2_fp32 45 "$pentad" train "${gpt2[@]}" --set train.device=$device \
  --set train.precision=fp32 --set train.steps=$fp32_steps --set train.out_dir="$runs/gpt2_fp32"

# ---- summary ----
GB_SUMMARY=$summary GB_LOGS=$logs GB_RUNS=$runs GB_COMMIT=$commit GB_DIRTY=$dirty \
  GB_BUILD_STATUS=$build_status GB_BUILD_SECONDS=$build_seconds GB_SMOKE=$smoke \
  GB_WARMUPS="gpt2_bf16=$gpt2_warmup gpt2_fp32=$fp32_warmup llama_bf16=$llama_warmup" \
  "$PYTHON" - <<'EOF'
import datetime, json, os, re, socket, statistics, sys
from pathlib import Path

env = os.environ
logs, runs = Path(env["GB_LOGS"]), Path(env["GB_RUNS"])
warmups = {k: int(v) for k, v in (kv.split("=") for kv in env["GB_WARMUPS"].split())}
parts = {}
for line in (runs / "parts").read_text().splitlines():
    name, status, seconds, limit = line.split()
    cmd = runs / f"{name}.cmd"
    parts[name] = {"status": status, "seconds": int(seconds), "limit_s": int(limit),
                   "command": cmd.read_text().strip() if cmd.exists() else None}


def log_text(name):
    path = logs / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


smi = (runs / "nvidia-smi.txt").read_text()
gpu_name = smi.strip().splitlines()[-1].split(",")[0].strip() if "name, driver" in smi else ""
override = float(env.get("GPU_BENCH_PEAK_TFLOPS") or 0)
sys.path.insert(0, "bench")
try:
    import torch_gpt2
    peak = torch_gpt2.peak_tflops(gpu_name, override)
except Exception as e:  # no PyTorch here: only an explicit peak
    print(f"gpu_bench: no peak table ({e})", file=sys.stderr)
    torch_gpt2, peak = None, override or None


def timing(seconds, tokens, flops, warmup):
    """Median step time after the warm-up and what follows from it."""
    timed = seconds[warmup:]
    if len(timed) < 2:
        return {}
    s = statistics.median(timed)
    return dict(timed_steps=len(timed), ms_per_step=s * 1e3, ms_per_step_min=min(timed) * 1e3,
                ms_per_step_max=max(timed) * 1e3, tokens_per_step=tokens,
                tokens_per_second=tokens / s, flops_per_step=flops,
                tflops=flops / s / 1e12 if flops else None,
                mfu=flops / s / 1e12 / peak if flops and peak else None,
                ms_per_step_mean=statistics.fmean(timed) * 1e3)


def pentad_run(name, run_dir, warmup):
    metrics = runs / run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    rows = [json.loads(l) for l in lines if l.strip()]
    rows = [r for r in rows if "seconds" in r and "loss" in r]
    out = dict(parts.get(name, {}), steps_done=len(rows), warmup_steps=warmup)
    if rows:
        first = rows[0]
        out.update(first_step_s=first["seconds"], loss_first=first["loss"],
                   loss_last=rows[-1]["loss"])
        out.update(timing([r["seconds"] for r in rows],
                          round(first["tokens_per_second"] * first["seconds"]),
                          first["flops_per_second"] * first["seconds"], warmup))
        # Wall time a step after the warm-up, from elapsed_seconds: a step's "seconds" leave
        # out what the training thread waits for checkpoints between steps (blocked_seconds).
        if len(rows) > warmup + 1 and "elapsed_seconds" in rows[0]:
            wall = rows[-1]["elapsed_seconds"] - rows[warmup]["elapsed_seconds"]
            out["wall_ms_per_step_mean"] = wall / (len(rows) - 1 - warmup) * 1e3
            out["blocked_seconds"] = sum(r.get("blocked_seconds", 0.0) for r in rows[warmup + 1:])
    plan = re.search(r"memory plan.*", log_text(name))
    out["memory_plan"] = plan.group(0) if plan else None
    return out


def llmc_run(warmup, flops):
    # llm.c prints "step    2/30 | loss 10.98 (+0.00z)| norm 1.23 (+0.00z)| lr 6.00e-04 |
    # 123.45 ms | 45.6% bf16 MFU | 265432 tok/s" (one line)
    # (MFU is -100.0% where llm.c has no peak for the device, e.g. an H200)
    steps = re.findall(r"^step\s+\d+/\d+ \| loss (\S+) .*?\| ([\d.]+) ms \| (-?[\d.]+)% bf16 MFU",
                       log_text("llmc_gpt2"), re.M)
    out = dict(parts.get("llmc_gpt2", {}), steps_done=len(steps), warmup_steps=warmup)
    if steps:
        out.update(loss_first=float(steps[0][0]), loss_last=float(steps[-1][0]),
                   first_step_s=float(steps[0][1]) / 1e3,
                   llmc_own_mfu_last=float(steps[-1][2]) / 100)
        out.update(timing([float(s[1]) / 1e3 for s in steps], 4 * 1024 * 8, flops, warmup))
    return out


torch_run = dict(parts.get("torch_gpt2", {}))
for line in log_text("torch_gpt2").splitlines():
    if line.startswith("{"):
        torch_run.update(json.loads(line))
p16 = pentad_run("pentad_gpt2_bf16", "gpt2_bf16", warmups["gpt2_bf16"])
gpt2_flops = p16.get("flops_per_step") or torch_run.get("flops_per_step")
if not gpt2_flops and torch_gpt2:  # GPT-2 124M as llm.c runs it, counted as pentad counts
    import argparse
    gpt2_flops = torch_gpt2.flops_per_step(argparse.Namespace(
        layers=12, width=768, seq=1024, vocab=50304, micro_batch=4, grad_accum=8))
summary = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "commit": env["GB_COMMIT"],
    "uncommitted_files": int(env["GB_DIRTY"] or 0),
    "host": socket.gethostname(),
    "smoke": env["GB_SMOKE"] == "1",
    "gpu": gpu_name,
    "peak_bf16_tflops": peak,
    "nvidia_smi": smi,
    "build": {"status": env["GB_BUILD_STATUS"], "seconds": int(env["GB_BUILD_SECONDS"])},
    "pentad_gpt2_124m_bf16": p16,
    "torch_gpt2_124m_bf16": torch_run,
    "llmc_gpt2_124m_bf16": llmc_run(warmups["gpt2_bf16"], gpt2_flops),
    "pentad_gpt2_124m_fp32": pentad_run("pentad_gpt2_fp32", "gpt2_fp32", warmups["gpt2_fp32"]),
    "pentad_llama_1b_bf16": pentad_run("pentad_llama1b_bf16", "llama_bf16", warmups["llama_bf16"]),
    "pentad_llama_1b_bf16_recompute": pentad_run("pentad_llama1b_bf16_recompute",
                                                 "llama_bf16_recompute", warmups["llama_bf16"]),
    "pentad_gpt2_124m_bf16_save10": pentad_run("pentad_gpt2_bf16_save10", "gpt2_save10",
                                               warmups["gpt2_bf16"]),
    "pentad_gpt2_124m_bf16_save1": pentad_run("pentad_gpt2_bf16_save1", "gpt2_save1",
                                              warmups["gpt2_bf16"]),
    "pentad_gpt2_124m_bf16_memory1": pentad_run("pentad_gpt2_bf16_memory1", "gpt2_memory1",
                                                warmups["gpt2_bf16"]),
    "kernels_bench": dict(parts.get("kernels", {}), output=log_text("kernels")),
    "attention_torch": dict(parts.get("attention_torch", {}), output=log_text("attention_torch")),
    "generate_decode": dict(parts.get("generate_decode", {})),
}
# bench/generate_speed.py's last line is its figures as JSON.
for line in log_text("generate_decode").splitlines():
    if line.startswith("{"):
        summary["generate_decode"].update(json.loads(line))
ratio = lambda a, b: a / b if a and b else None
tps = lambda key: summary[key].get("tokens_per_second")
summary["ratios"] = {
    "pentad_bf16_over_torch": ratio(tps("pentad_gpt2_124m_bf16"), tps("torch_gpt2_124m_bf16")),
    "pentad_bf16_over_llmc": ratio(tps("pentad_gpt2_124m_bf16"), tps("llmc_gpt2_124m_bf16")),
    "pentad_bf16_over_fp32": ratio(tps("pentad_gpt2_124m_bf16"), tps("pentad_gpt2_124m_fp32")),
}
mean_ms = lambda key: summary[key].get("wall_ms_per_step_mean")
# throughput with saves over throughput without: mean wall time a step without over with
summary["ratios"]["save_every_10_over_none"] = ratio(mean_ms("pentad_gpt2_124m_bf16"),
                                                     mean_ms("pentad_gpt2_124m_bf16_save10"))
summary["ratios"]["save_every_1_over_none"] = ratio(mean_ms("pentad_gpt2_124m_bf16"),
                                                    mean_ms("pentad_gpt2_124m_bf16_save1"))
summary["ratios"]["memory_every_1_over_none"] = ratio(mean_ms("pentad_gpt2_124m_bf16"),
                                                      mean_ms("pentad_gpt2_124m_bf16_memory1"))
# The op profiles (--op-profile): each op's share of the device's step, in the summary whole.
for name in ["llama1b_bf16", "gpt2_bf16"]:
    path = logs / f"{name}_profile.json"
    summary[f"op_profile_{name}"] = json.loads(path.read_text()) if path.exists() else None
Path(env["GB_SUMMARY"]).write_text(json.dumps(summary, indent=1) + "\n")

fmt = lambda v, f: "-" if v is None else format(v, f)
build = summary["build"]
print(f"\ncommit {summary['commit']} | {gpu_name or 'no GPU'} | dense bf16 peak "
      f"{fmt(peak, '.1f')} TFLOP/s | build {build['status']} ({build['seconds']} s)")
print(f"{'run (tokens/s over median step)':34} {'status':11} {'steps':>5} {'ms/step':>9} "
      f"{'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'loss first->last':>17}")
for key in ["pentad_gpt2_124m_bf16", "torch_gpt2_124m_bf16", "llmc_gpt2_124m_bf16",
            "pentad_gpt2_124m_fp32", "pentad_llama_1b_bf16", "pentad_llama_1b_bf16_recompute",
            "pentad_gpt2_124m_bf16_save10",
            "pentad_gpt2_124m_bf16_save1", "pentad_gpt2_124m_bf16_memory1"]:
    r = summary[key]
    losses = (f"{r['loss_first']:.3f}->{r['loss_last']:.3f}" if r.get("loss_first") is not None
              else "-")
    print(f"{key:34} {r.get('status', '-'):11} {fmt(r.get('timed_steps'), 'd'):>5} "
          f"{fmt(r.get('ms_per_step'), '.1f'):>9} {fmt(r.get('tokens_per_second'), ',.0f'):>10} "
          f"{fmt(r.get('tflops'), '.1f'):>8} {fmt(r.get('mfu'), '.3f'):>6} {losses:>17}")
gemm = torch_run.get("gemm")
if gemm:
    print(f"{gemm['dtype']} GEMM {gemm['n']}^3 through PyTorch: {gemm['tflops']:.1f} TFLOP/s")
print("tokens/s ratios: " + ", ".join(f"{k} {fmt(v, '.3f')}" for k, v in summary["ratios"].items()))
g = summary["generate_decode"]
print(f"decode ({g.get('status', '-')}): pentad generate {fmt(g.get('pentad_decode_tokens_per_s'), '.1f')}"
      f" tokens/s, {g.get('reference') or 'the reference'} "
      f"{fmt(g.get('reference_decode_tokens_per_s'), '.1f')} tokens/s, ratio "
      f"{fmt(g.get('decode_ratio'), '.2f')} ({g.get('precision', '-')}, {g.get('new_tokens', '-')}"
      f" tokens after {g.get('prompt_tokens', '-')})")
for name in ["llama1b_bf16", "gpt2_bf16"]:
    prof = summary[f"op_profile_{name}"]
    if not prof or not prof.get("steps"):
        continue
    top = ", ".join(f"{o['op']} {o['share']:.1%}" + (f" ({o['flops_per_second'] / 1e12:.3g} TFLOP/s)"
                                                     if o.get("flops_per_second") else "")
                    for o in prof["ops"][:6])
    outside = prof["outside_seconds"] / prof["step_seconds"] if prof["step_seconds"] else 0
    print(f"op profile {name} ({prof['step_seconds'] / prof['steps'] * 1e3:.1f} ms a step): {top};"
          f" outside the ops {outside:.1%}")
print(f"summary: {env['GB_SUMMARY']}; logs: {logs}")
EOF
