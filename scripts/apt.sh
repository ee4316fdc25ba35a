# shellcheck shell=bash
# Sourced by the scripts that install Debian packages (install.sh, cross_aarch64.sh).
#   install_apt_packages PKG...   apt-get install those of PKG not installed yet (no apt-get
#                                 update either when all are)

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_apt_packages() {
  local script missing=()
  script="$(basename "$0")"
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$script: apt packages present"
    return
  fi
  echo "$script: apt-get install ${missing[*]}"
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}
