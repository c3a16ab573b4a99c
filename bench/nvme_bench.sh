#!/usr/bin/env bash
# The NVMe offload engine (optim/nvme_state) against fio on the same directory, with the same
# request size, queue depth and file size: fio's sequential O_DIRECT io_uring write then read
# is what the disk gives one submitting thread; pentad_nvme_bench is ours. fio and pentad take
# turns, `reps` times per (block, depth), and the table shows medians (GB/s, 1e9 bytes/s),
# each ratio pentad / fio (target: 0.9 or more) with its range over the repetitions, and
# update()'s bandwidth (bytes read + written per second), the share of its I/O hidden behind
# an AdamW-like fn, and the most that could be (the fn's time over the I/O's).
#
#   bench/nvme_bench.sh [dir=/tmp/pentad-nvme-bench] [gib=2] [reps=3] [build=build-x] [pairs...]
# pairs are KiB:depth, by default 256:8 1024:8 1024:32. Needs fio (apt-get install -y fio).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/pentad-nvme-bench}
gib=${2:-2}
reps=${3:-3}
build=${4:-build-x}
shift $(($# < 4 ? $# : 4))
pairs=("$@")
((${#pairs[@]})) || pairs=(256:8 1024:8 1024:32)
command -v fio >/dev/null || {
  echo "nvme_bench: fio not found (apt-get install -y fio)"
  exit 1
}
mkdir -p "$dir"
file="$dir/fio-bench.file"
trap 'rm -f "$file"' EXIT

fio_gbps() {  # rw kib depth: fio's bandwidth for one sequential pass
  fio --name="nvme-$1" --filename="$file" --direct=1 --ioengine=io_uring --rw="$1" \
    --bs="$2k" --iodepth="$3" --size="${gib}g" --numjobs=1 --output-format=json |
    python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]; \
print('%.3f' % (j['$1']['bw_bytes'] / 1e9))"
}

# Median of the numbers in $1, and of the ratios $1[i] / $2[i] with their range.
summary() {
  python3 - "$@" <<'EOF'
import statistics, sys
ours = [float(x) for x in sys.argv[1].split()]
if len(sys.argv) == 2:
    print('%.2f' % statistics.median(ours))
else:
    ratios = [a / b for a, b in zip(ours, (float(x) for x in sys.argv[2].split()))]
    print('%.2f (%.2f-%.2f)' % (statistics.median(ratios), min(ratios), max(ratios)))
EOF
}

echo "disk under $dir: $(df --output=source "$dir" | tail -n 1), $(nproc) cores, ${gib} GiB," \
  "$reps repetitions, load average $(cut -d' ' -f1-3 /proc/loadavg)"
format='%-8s %-6s %-9s %-9s %-17s %-9s %-9s %-17s %-8s %-7s %s\n'
printf "$format" block depth fio_write pentad_w "ratio (range)" fio_read pentad_r \
  "ratio (range)" update hidden "(at most)"
for pair in "${pairs[@]}"; do
  kib=${pair%%:*}
  depth=${pair##*:}
  fw="" fr="" pw="" pr="" up="" hid="" most=""
  for ((r = 0; r < reps; ++r)); do
    fw+=" $(fio_gbps write "$kib" "$depth")"
    fr+=" $(fio_gbps read "$kib" "$depth")"
    rm -f "$file"
    result=$("$build/pentad_nvme_bench" --dir="$dir" --gib="$gib" --block-kib="$kib" \
      --depth="$depth" | grep '^RESULT')
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" ${result#RESULT}"; }
    pw+=" $(get write_gbps)" pr+=" $(get read_gbps)" up+=" $(get update_gbps)"
    hid+=" $(get hidden)" most+=" $(get hideable)"
  done
  printf "$format" "${kib}KiB" "$depth" "$(summary "$fw")" "$(summary "$pw")" \
    "$(summary "$pw" "$fw")" "$(summary "$fr")" "$(summary "$pr")" "$(summary "$pr" "$fr")" \
    "$(summary "$up")" "$(summary "$hid")" "$(summary "$most")"
  echo "  raw GB/s: fio write$fw | pentad write$pw | fio read$fr | pentad read$pr |" \
    "update$up | hidden$hid | at most$most"
done
