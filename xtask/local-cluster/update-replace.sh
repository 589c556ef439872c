#!/usr/bin/env bash
# Regenerates the staging `replace` block of go.mod from the pinned Kubernetes version's own go.mod.
#
# k8s.io/kubernetes requires every staging module (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and
# resolves them through replace lines of its own, which Go ignores in a dependency. This script reads
# the `k8s.io/<name> v0.0.0` requirements from the module proxy's copy of that go.mod and replaces
# each with the published v0.<minor>.<patch> that matches the pinned version.
#
# Usage: ./update-replace.sh v1.37.2                    (this module: the cluster's components)
#        ./update-replace.sh v1.34.4 kubelet/v1.34.4    (an older kubelet's own module, for version
#                                                        skew: created if missing, builds
#                                                        k8s.io/kubernetes/cmd/kubelet as a tool)
set -euo pipefail
cd "$(dirname "$0")"
version="${1:?usage: $0 <kubernetes version, e.g. v1.37.2> [module dir, e.g. kubelet/v1.34.4]}"
if [ -n "${2:-}" ]; then
	mkdir -p "$2"
	cd "$2"
	if [ ! -f go.mod ]; then
		printf 'module github.com/dra-e2e/dra-e2e/xtask/local-cluster/%s\n\ngo 1.26.0\n' "$2" >go.mod
	fi
	go mod edit -tool=k8s.io/kubernetes/cmd/kubelet
fi
staging="v0.${version#v1.}"
modfile="$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
[ -f "$modfile" ] || { echo "could not download the go.mod of k8s.io/kubernetes@${version}" >&2; exit 1; }
# Drop the previous staging replacements, then add one per v0.0.0 requirement.
for old in $(go mod edit -json | sed -n 's/.*"Path": "\(k8s.io\/[^"]*\)".*/\1/p' | sort -u); do
	go mod edit -dropreplace="$old" 2>/dev/null || true
done
for name in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$modfile"); do
	go mod edit -replace="${name}=${name}@${staging}"
done
go mod edit -require="k8s.io/kubernetes@${version}"
go mod tidy
