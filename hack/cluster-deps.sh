#!/usr/bin/env bash
# cluster-deps.sh installs, from Debian's packages, what the cluster tests'
# node needs and Go cannot build: containerd, runc, the CNI plugins,
# iptables and iproute2. It installs only what is missing, and only as
# root on a machine with apt-get; otherwise it says what is missing and
# why, and exits 0: the short cluster test then skips, naming the same
# things (`make test-cluster` fails instead).
set -euo pipefail

need=()
command -v containerd >/dev/null || need+=(containerd)
command -v ctr >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v ip >/dev/null || need+=(iproute2)
[ ${#need[@]} -gt 0 ] || exit 0

mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
	echo "==> cluster tests: missing ${need[*]}; not root, so not installing them (the cluster tests will skip)" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "==> cluster tests: missing ${need[*]}; no apt-get to install them with (the cluster tests will skip)" >&2
	exit 0
fi
echo "==> cluster tests: installing ${need[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >&2; then
	echo "==> cluster tests: could not install ${need[*]} (the cluster tests will skip)" >&2
fi
