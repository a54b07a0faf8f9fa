# Shared set-up of run.sh and test.sh (sourced, not run): installs the Debian
# packages that are missing, then configures and builds Release in build/.
# Quick when nothing changed: no apt call, an incremental build.

G3_PACKAGES=(cmake make g++ pkg-config libhwy-dev libxbyak-dev catch2 llvm-19-dev nlohmann-json3-dev libdnnl-dev ocl-icd-opencl-dev
             libopenmpi-dev openmpi-bin clang libclang-rt-14-dev)

g3_install_packages() {
  local missing=()
  for p in "${G3_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  local line="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "g3attn: missing Debian packages: ${missing[*]}" >&2
    echo "g3attn: run as root: $line" >&2
    exit 1
  fi
  echo "g3attn: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

g3_build() {  # g3_build DIR [cmake options...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
}
