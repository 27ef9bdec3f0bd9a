#!/usr/bin/env bash
# Spark needs Java 17 or newer; install a headless JRE with apt when it is missing or older.
set -euo pipefail
major() { java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'; }
if command -v java >/dev/null && [[ "$(major)" -ge 17 ]]; then exit 0; fi
echo "java: Java 17+ not found, installing a headless JRE with apt" >&2
sudo_() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
. /etc/os-release
pkg=openjdk-17-jre-headless; [[ "${VERSION_ID%%.*}" -ge 13 ]] && pkg=openjdk-21-jre-headless
# `make test` installs the broker at the same time: wait for its dpkg lock rather than fail.
apt_=(flock /run/rmqs-apt.lock apt-get -o DPkg::Lock::Timeout=600)
sudo_ "${apt_[@]}" update -qq
DEBIAN_FRONTEND=noninteractive sudo_ "${apt_[@]}" install -y --no-install-recommends "$pkg" >/dev/null
[[ "$(major)" -ge 17 ]] || { echo "java: still no Java 17+ after installing $pkg" >&2; exit 1; }
