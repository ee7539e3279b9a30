#!/usr/bin/env bash
# `make install` and the Debian package (`make deb`), checked in scratch folders as a user's
# machine would see them. Run by ctest (install_test) on a built Release tree:
#   install_test.sh BUILD_DIR SOURCE_DIR VERSION PYTHON
#
# - `cmake --install` under a DESTDIR (prefix /usr/local): the installed binary gives its version;
#   the Python module imports from the installed dist-packages and generates; a C++ project
#   (tests/install/consumer) builds against the installed find_package(Pagoda) / pagoda::engine
#   and generates.
# - The .deb built by cpack: its control data (dependencies found by dpkg-shlibdeps,
#   /etc/default/pagoda a conffile, maintainer scripts that parse), its files unpacked with
#   dpkg-deb -x, `systemd-analyze verify` on its unit, the unit's stop timeout above the drain
#   /etc/default/pagoda allows, and the packaged binary and Python module run from there.
# Generated tokens are compared with the test data's golden greedy sample of stories260K.
set -euo pipefail

build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
version=$3
python=$4
tokens=24

required() {
  local v
  for v in "${CI:-}" "${PAGODA_REQUIRE_TEST_DATA:-}"; do
    case "$v" in "" | 0 | false) ;; *) return 0 ;; esac
  done
  return 1
}
data=${PAGODA_TEST_DATA:-$source/../shared/models}
model=$data/stories260K/stories260K.gguf
if [ ! -f "$model" ]; then
  if required; then
    echo "FAIL: test data missing: $model" >&2
    exit 1
  fi
  echo "test data missing: $model (set PAGODA_TEST_DATA); skipped"
  exit 77
fi
golden=$(tr -s ' \n' '\n\n' < "$data/stories260K/greedy-bos-256.ids" | grep . | head -n $tokens | tr '\n' ' ')

scratch=$(mktemp -d "${TMPDIR:-/tmp}/pagoda-install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"  # so that no ./pagoda folder can shadow the installed module

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
same_tokens() {  # what, got
  [ "$(echo $2)" = "$(echo $golden)" ] || fail "$1: greedy tokens '$2', the golden sample begins '$golden'"
  echo "ok: $1 generates the golden sample ($tokens tokens)"
}
# The installed Python module, from dist-packages folder $1: where it is imported from, and what it generates.
check_python() {
  local out
  out=$(PYTHONPATH=$1 "$python" - "$1" "$model" "$tokens" <<'PY'
import os, sys
import pagoda
site, model, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
where = os.path.dirname(os.path.realpath(pagoda.__file__))
if where != os.path.realpath(os.path.join(site, "pagoda")):
    sys.exit(f"pagoda imported from {where}, not {site}")
llm = pagoda.LLM(model=model, max_model_len=256)
bos = llm.get_tokenizer().bos_token_id
out = llm.generate({"prompt_token_ids": [bos]}, pagoda.SamplingParams(temperature=0, max_tokens=tokens), use_tqdm=False)
print(" ".join(str(t) for t in out[0].outputs[0].token_ids))
PY
  ) || fail "the Python module in $1"
  same_tokens "the Python module in $1" "$out"
}
check_version() {
  local got
  got=$("$1" --version) || fail "$1 --version"
  [ "$got" = "$version" ] || fail "$1 --version says '$got', want '$version'"
  echo "ok: $1 --version is $version"
}

# ---- make install ----
echo "== cmake --install (DESTDIR, prefix /usr/local)"
DESTDIR=$scratch/destdir cmake --install "$build" --prefix /usr/local > install.log || { cat install.log; fail "cmake --install"; }
prefix=$scratch/destdir/usr/local
check_version "$prefix/bin/pagoda"
pyver=$("$python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
check_python "$prefix/lib/$pyver/dist-packages"
cmake -S "$source/tests/install/consumer" -B consumer -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" > consumer.log 2>&1 || { cat consumer.log; fail "configuring a project with find_package(Pagoda)"; }
grep -q "$prefix/lib/cmake/Pagoda" consumer/CMakeCache.txt || fail "find_package(Pagoda) did not take $prefix"
cmake --build consumer > consumer-build.log 2>&1 || { cat consumer-build.log; fail "building against pagoda::engine"; }
same_tokens "a C++ program linking pagoda::engine" "$(consumer/consumer "$model" $tokens)"

# ---- the Debian package ----
echo "== cpack -G DEB"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$scratch/packages" > cpack.log 2>&1 || { cat cpack.log; fail "cpack"; }
deb=$(ls "$scratch"/packages/pagoda_"$version"_*.deb) || fail "no pagoda_${version}_*.deb built"
depends=$(dpkg-deb -f "$deb" Depends)
for dep in "python3 (>= " python3-tqdm libpcre2-8-0 libopenmpi3 libstdc++6 adduser; do
  [[ "$depends" == *"$dep"* ]] || fail "Depends lacks $dep: $depends"
done
echo "ok: Depends: $depends"
dpkg-deb -e "$deb" control
[ "$(cat control/conffiles)" = /etc/default/pagoda ] || fail "conffiles: $(cat control/conffiles)"
for script in postinst prerm postrm; do
  [ -x "control/$script" ] || fail "$script is not executable"
  sh -n "control/$script" || fail "$script does not parse"
done
echo "ok: conffiles and maintainer scripts"
dpkg-deb -x "$deb" root
for f in usr/bin/pagoda usr/lib/libpagoda.so usr/lib/cmake/Pagoda/PagodaConfig.cmake usr/include/pagoda/engine/llm.h \
  usr/lib/python3/dist-packages/pagoda/__init__.py usr/lib/systemd/system/pagoda.service etc/default/pagoda; do
  [ -e "root/$f" ] || fail "the package lacks /$f"
done
check_version "$scratch/root/usr/bin/pagoda"
check_python "$scratch/root/usr/lib/python3/dist-packages"

# The unit, verified by systemd with its binary where the package put it.
unit=root/usr/lib/systemd/system/pagoda.service
sed "s|/usr/bin/pagoda|$scratch/root/usr/bin/pagoda|" "$unit" > pagoda.service
verify=$(systemd-analyze verify --man=no --recursive-errors=no "$scratch/pagoda.service" 2>&1) ||
  fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify: $verify"
echo "ok: systemd-analyze verify pagoda.service"
grep -qx "Restart=on-failure" "$unit" || fail "the unit does not restart on failure"
grep -qx "User=pagoda" "$unit" || fail "the unit does not run as the pagoda user"
grep -qx "EnvironmentFile=/etc/default/pagoda" "$unit" || fail "the unit does not read /etc/default/pagoda"
# Every setting ExecStart names is in /etc/default/pagoda.
for var in $(grep '^ExecStart=' "$unit" | grep -o '\$[{]\?[A-Z_]*' | tr -d '${'); do
  grep -q "^$var=" root/etc/default/pagoda || fail "ExecStart uses $var, which /etc/default/pagoda does not set"
done
# The drain: TimeoutStopSec must exceed the largest --shutdown-timeout the settings file allows.
stop=$(sed -n 's/^TimeoutStopSec=//p' "$unit")
drain=$(sed -n 's/^PAGODA_SHUTDOWN_TIMEOUT=//p' root/etc/default/pagoda)
allowed=$(grep -o 'At most [0-9]*' root/etc/default/pagoda | grep -o '[0-9]*$')  # the limit it documents
[ -n "$stop" ] && [ -n "$drain" ] && [ -n "$allowed" ] || fail "TimeoutStopSec '$stop', PAGODA_SHUTDOWN_TIMEOUT '$drain', documented limit '$allowed'"
[ "$drain" -le "$allowed" ] && [ "$stop" -gt "$allowed" ] ||
  fail "TimeoutStopSec=$stop must exceed the drain: PAGODA_SHUTDOWN_TIMEOUT=$drain, at most $allowed"
echo "ok: TimeoutStopSec=$stop above PAGODA_SHUTDOWN_TIMEOUT=$drain (at most $allowed)"
echo "PASS"
