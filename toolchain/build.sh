#!/usr/bin/env bash
# make toolchain: the Pulumi CLI, its Python language host and the command and docker provider plugins, built
# here from Go modules with the ordinary `go` command (no prebuilt Pulumi binary is on a registry this project
# can reach). Idempotent: the binaries go into a cache directory outside the checkout, keyed by the Go version,
# the versions below and every file under toolchain/ but the READMEs and licenses, and a second run only prints
# where they are; two runs at once take turns. The last line printed is that directory: put it first on PATH
# (docs/rehearse.md).
#
# What comes from where (toolchain/README.md): the CLI and its SDK straight from the module proxy (a wrapper
# module, toolchain/cli, since pkg/v3's own go.mod has replace directives); the language host's and the two
# providers' sources are copied from their public repositories at a release (the proxy serves none of those
# three modules) and built against modules from the proxy.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

CLI_VERSION=v3.277.0
LANGUAGE_HOST_SOURCE="pulumi/pulumi v3.259.0 (sdk/python/cmd/pulumi-language-python/main.go)"
COMMAND_VERSION=1.2.1
DOCKER_VERSION=5.1.0
DOCKER_UPSTREAM=github.com/kreuzwerker/terraform-provider-docker@v0.0.0-20260916201441-96d331c98ff4
BINARIES="pulumi pulumi-language-python pulumi-language-python-exec pulumi-resource-command pulumi-resource-docker"

fail() { echo "make toolchain: $*" >&2; exit 2; }
step() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*"; }

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then PATH="/usr/local/go/bin:$PATH"; fi
command -v go >/dev/null 2>&1 || fail "no 'go' on PATH: install Go 1.26.6 or newer (go.dev/dl; Debian's golang-go is older)"
go_version="$(go env GOVERSION)"
# The go.mod files say `go 1.26.6`: 1.26.6 or newer, a development build of a newer Go included.
if ! printf '%s\n' "$go_version" | grep -Eq '(^|[^0-9.])go?1\.(26\.([6-9]|[1-9][0-9])|2[7-9]|[3-9][0-9]|[1-9][0-9]{2,})'; then
  fail "Go $go_version is too old: these modules need Go 1.26.6 or newer (go.mod 'go 1.26.6'; go.dev/dl)"
fi

home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
[ -n "$home" ] || fail "no HOME and no home directory in the password database: set VLLM_CLUSTER_TOOLCHAIN_CACHE"
# The key: the Go version, the versions above and every file here that goes into a build (this script
# included, for its flags and patch steps); the READMEs and licenses do not.
key="$( (echo "$go_version $CLI_VERSION $COMMAND_VERSION $DOCKER_VERSION $DOCKER_UPSTREAM"
         cd "$HERE" && find . -type f ! -name README.md ! -name LICENSE -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12)"
cache_root="${VLLM_CLUSTER_TOOLCHAIN_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/vllm-cluster/toolchain}"
out="$cache_root/pulumi-${CLI_VERSION#v}-command-$COMMAND_VERSION-docker-$DOCKER_VERSION-$key"
mkdir -p "$cache_root" || fail "cannot create the cache directory $cache_root"
# One build at a time per cache: a second `make toolchain` waits, then finds the first one's result.
exec 9>"$cache_root/.build.lock"
flock 9

versions() {
  echo "  pulumi                       $CLI_VERSION  (github.com/pulumi/pulumi/pkg/v3, sdk/v3)"
  echo "  pulumi-language-python       $CLI_VERSION  (source: $LANGUAGE_HOST_SOURCE)"
  echo "  pulumi-resource-command      $COMMAND_VERSION  (source: pulumi/pulumi-command v$COMMAND_VERSION provider/)"
  echo "  pulumi-resource-docker       $DOCKER_VERSION  (source: pulumi/pulumi-docker 237b7899 = v$DOCKER_VERSION + bridge v3.137.0, provider/; upstream $DOCKER_UPSTREAM)"
  echo "  go                           $go_version"
}

complete() {  # every binary there, and the build finished
  [ -f "$1/.complete" ] || return 1
  for b in $BINARIES; do [ -x "$1/bin/$b" ] || return 1; done
}

if complete "$out"; then
  step "toolchain already built (cache hit, key $key):"
  versions
  echo "$out/bin"
  exit 0
fi

step "building the Pulumi toolchain into $out (cold: ~10 min on 2 cores with downloads, most of it the CLI and the docker provider)"
versions
work="$out.tmp"
rm -rf "$work"
mkdir -p "$work/bin" "$work/src"
export GOFLAGS="-mod=readonly -trimpath"
started=$SECONDS

timed() {  # timed NAME COMMAND...: run, print how long it took
  local name="$1" t0=$SECONDS; shift
  step "building $name..."
  "$@" || fail "building $name failed (output above); nothing was installed into $out"
  step "built $name in $((SECONDS - t0)) s"
}

sdk_dir() {  # the sdk/v3 module at the CLI's version, from the module cache (downloaded when missing)
  (cd "$HERE/cli" && go mod download -json "github.com/pulumi/pulumi/sdk/v3@$CLI_VERSION") |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

build_cli() {
  (cd "$HERE/cli" && go build -tags osusergo,grpcnotrace -o "$work/bin/pulumi" \
    -ldflags "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$CLI_VERSION" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi)
}

build_language_host() {  # every step `|| return 1`: set -e does not apply in a function called with `||`
  (cd "$HERE/language-python" && go build -o "$work/bin/pulumi-language-python" \
    -ldflags "-X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$CLI_VERSION" .) || return 1
  # The host refuses to start without its companion script beside it; it ships in sdk/v3.
  local sdk; sdk="$(sdk_dir)" || return 1
  [ -f "$sdk/python/cmd/pulumi-language-python-exec" ] || { echo "no pulumi-language-python-exec in $sdk" >&2; return 1; }
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$work/bin/pulumi-language-python-exec"
}

build_command() {
  (cd "$HERE/command/provider" && go build -o "$work/bin/pulumi-resource-command" \
    -ldflags "-X github.com/pulumi/pulumi-command/provider/pkg/version.Version=$COMMAND_VERSION" \
    ./cmd/pulumi-resource-command)
}

build_docker() {
  # provider/go.mod replaces the Terraform provider with ../upstream: the upstream module from the proxy, with
  # pulumi-docker's two patches (the shim package that exposes internal/provider.New, and its registry TLS fix).
  local src="$work/src/docker" upstream
  mkdir -p "$src" && cp -r "$HERE/docker/provider" "$src/provider" || return 1
  upstream="$(cd "$src/provider" && go mod download -json "$DOCKER_UPSTREAM" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$upstream" ] || { echo "could not download $DOCKER_UPSTREAM" >&2; return 1; }
  cp -r "$upstream" "$src/upstream" && chmod -R u+w "$src/upstream" || return 1
  for patch in "$HERE"/docker/patches/*.patch; do
    (cd "$src/upstream" && patch -p1 -s < "$patch") || { echo "patch $(basename "$patch") does not apply" >&2; return 1; }
  done
  # The provider embeds its Pulumi schema (stored gzipped, as released) with the version stamped in.
  (cd "$src/provider/cmd/pulumi-resource-docker" && gzip -dc schema.json.gz > schema.json &&
    VERSION="$DOCKER_VERSION" go run ./generate.go) || return 1
  (cd "$src/provider" && go build -o "$work/bin/pulumi-resource-docker" \
    -ldflags "-X github.com/pulumi/pulumi-docker/provider/v5/pkg/version.Version=$DOCKER_VERSION" \
    ./cmd/pulumi-resource-docker)
}

timed "pulumi $CLI_VERSION" build_cli
timed "pulumi-language-python" build_language_host
timed "pulumi-resource-command $COMMAND_VERSION" build_command
timed "pulumi-resource-docker $DOCKER_VERSION" build_docker

for b in $BINARIES; do [ -x "$work/bin/$b" ] || fail "$b missing after the build"; done
"$work/bin/pulumi" version >/dev/null || fail "the built pulumi does not run"
for plugin in command docker; do  # each plugin starts and serves its schema, through the built CLI
  PULUMI_HOME="$work/pulumi-home" PULUMI_SKIP_UPDATE_CHECK=true "$work/bin/pulumi" package get-schema \
    "$work/bin/pulumi-resource-$plugin" >/dev/null || fail "the built pulumi-resource-$plugin does not serve its schema"
done
rm -rf "$work/pulumi-home"
rm -rf "$work/src" "$out"
touch "$work/.complete"
mv "$work" "$out"
step "toolchain built in $((SECONDS - started)) s"
echo "$out/bin"
