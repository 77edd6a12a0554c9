#!/usr/bin/env bash
# Proves the README's two first commands where they count: on a Debian 12
# machine with nothing installed. Makes a minimal Debian 12 root
# (debootstrap --variant=minbase: no compiler, no make), copies this working
# tree into it (the files git tracks plus new ones it does not ignore, so it
# tests what is here), and runs there, as root with a clean environment and
# no terminal, what a new user runs:
#   DEMO_STEPS=300 bash tools/demo.sh
#   bash tools/test.sh
# then checks that no test skipped for anything a fresh clone should bring
# (a missing file or package: only a GPU and Python may be absent here, and a
# privilege a chroot cannot give), and prints how long each step took. A machine that already has everything
# (as CI does) cannot see a build that needs a package nobody installs, or a
# script that needs a tool minbase lacks; this can.
#
# Needs root (debootstrap, chroot, mounts) and a Debian mirror; installs
# debootstrap when missing. Settings:
#   DEMO_STEPS          demo training steps (default 300: minutes, not hours)
#   DEBIAN_MIRROR       default: the mirror this machine's apt uses for bookworm,
#                       else http://deb.debian.org/debian
#   FRESH_ROOT_CACHE    where the pristine root is kept as a tarball between runs
#                       (default /var/cache/diffusion-fresh-root); every run
#                       still starts from a fresh copy of it
#   FRESH_ROOT_REFRESH=1  run debootstrap again instead of using the cached root
#   FRESH_ROOT_LOGS     where the logs go (default build/fresh_root)
#   FRESH_ROOT_KEEP=1   leave the root in place afterwards, to look inside
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
DEMO_STEPS=${DEMO_STEPS:-300}
cache=${FRESH_ROOT_CACHE:-/var/cache/diffusion-fresh-root}
logs=${FRESH_ROOT_LOGS:-$repo/build/fresh_root}
suite=bookworm

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh_root: needs root (debootstrap, chroot, mounts); run it with sudo" >&2
  exit 1
fi

# The mirror this machine's apt uses for the suite, in either sources format.
host_mirror() {
  local want=$1 f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
      awk -v s="$want" '$1 == "deb" && $3 == s { print $2; exit }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822 stanzas, blank-line separated: the first URI of one whose Suites has the suite
    awk -v s="$want" 'BEGIN { RS = ""; FS = "\n" } {
        uri = ""; ok = 0; deb = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^#/) continue
          if ($i ~ /^Types:/ && $i ~ /[ \t]deb([ \t]|$)/) deb = 1
          if ($i ~ /^URIs:/) { split($i, u, /[ \t]+/); uri = u[2] }
          if ($i ~ /^Suites:/) { n = split($i, w, /[ \t]+/); for (j = 2; j <= n; j++) if (w[j] == s) ok = 1 }
        }
        if (deb && ok && uri != "") { print uri; exit }
      }' "$f"
  done
}
mirror=${DEBIAN_MIRROR:-$(host_mirror "$suite" | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
security=$(host_mirror "$suite-security" | head -n 1)
security=${security:-http://deb.debian.org/debian-security}

if ! command -v debootstrap > /dev/null; then
  echo "fresh_root: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap > /dev/null
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/fresh_root.XXXXXX")
root=$work/root
mounts=()
cleanup() {
  set +e
  # processes still running inside the root (after an interruption) are ours
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2> /dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2> /dev/null
  done
  local i ok=1
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[i]}" 2> /dev/null || umount -R -l "${mounts[i]}" || ok=0
  done
  if [ "${FRESH_ROOT_KEEP:-0}" = 1 ]; then
    echo "fresh_root: the root is kept in $root (unmounted)"
  elif [ $ok = 1 ]; then
    # --one-file-system: never reach through a mount that failed to go away
    rm -rf --one-file-system "$work"
  else
    echo "fresh_root: could not unmount everything under $root; left it in place" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -a step_names step_secs
timed() {  # timed "what" command...: runs it, records its duration
  local what=$1 t0=$SECONDS rc=0
  shift
  echo "== $what"
  "$@" || rc=$?
  step_names+=("$what")
  step_secs+=($((SECONDS - t0)))
  return $rc
}

mkdir -p "$cache" "$logs" "$root"
tarball=$cache/$suite-minbase.tar.gz
make_root() {
  debootstrap --variant=minbase "$suite" "$root" "$mirror" > "$logs/debootstrap.log" 2>&1 ||
    { tail -n 20 "$logs/debootstrap.log"; return 1; }
  # the pristine root, before anything touches it
  tar -C "$root" --numeric-owner -czf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
}
if [ -f "$tarball" ] && [ "${FRESH_ROOT_REFRESH:-0}" != 1 ]; then
  timed "unpack the cached minimal Debian 12 root" tar -C "$root" --numeric-owner -xzf "$tarball"
else
  timed "debootstrap a minimal Debian 12 root ($mirror)" make_root
fi

# As a Debian 12 installation is set up: main, updates and security.
cat > "$root/etc/apt/sources.list" << EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
for m in proc sys dev; do
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sysfs "$root/sys" ;;
    dev) mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev" ;;
  esac
  mounts+=("$root/$m")
done

copy_tree() {
  local dst=$root/root/diffusion.c
  mkdir -p "$dst"
  if git -C "$repo" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git -C "$repo" ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
      tar -C "$repo" --null -T - -cf - | tar -C "$dst" -xf -
  else
    tar -C "$repo" --exclude=./build --exclude=./runs --exclude=./diffusion -cf - . | tar -C "$dst" -xf -
  fi
}
timed "copy the working tree in" copy_tree

# in_root LOG COMMAND: runs COMMAND in the repository inside the root, as a
# login would (clean environment, no terminal, no stdin); output to LOG.
in_root() {
  local log=$1
  shift
  if ! chroot "$root" /usr/bin/env -i HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEMO_STEPS="$DEMO_STEPS" /bin/bash -c "cd /root/diffusion.c && $*" < /dev/null > "$log" 2>&1; then
    echo "fresh_root: '$*' failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}
status=0
timed "DEMO_STEPS=$DEMO_STEPS bash tools/demo.sh" in_root "$logs/demo.log" bash tools/demo.sh || status=1
if [ $status = 0 ]; then
  n=$(find "$root/root/diffusion.c/runs/demo/samples" -name '*.png' | wc -l)
  if [ ! -s "$root/root/diffusion.c/runs/demo/grid.png" ] || [ "$n" -ne 1000 ]; then
    echo "fresh_root: the demo finished but wrote no grid.png or not 1000 samples ($n)" >&2
    status=1
  fi
fi
timed "bash tools/test.sh" in_root "$logs/test.log" bash tools/test.sh || status=1
grep -E "^(PASS|FAIL|     )|passed, " "$logs/test.log" || true

# No test may skip for a file or a package that a fresh clone and tools/deps.sh
# should bring: the files the tests read ship with the repository. Only a GPU
# and Python (not in deps.sh's base set) are absent here, and privileges a
# chroot lacks (unshare -m cannot make a private copy of a root that is no
# mount point). Read from every test's own log, whatever the runner made of it.
skip_problems() {  # skip_problems LOG_DIR: the skip lines of its logs that are not for those
  local f
  [ -n "$(ls "$1"/*.log 2> /dev/null)" ] || { echo "(no test logs in $1)"; return; }
  for f in "$1"/*.log; do
    grep -iE '^[[:space:]]*skip([[:space:]:(]|$)' "$f" | grep -vE '^[[:space:]]*SKIP \((no GPU|no python3|privileges)' |
      sed "s|^|$(basename "$f" .log): |" || true  # no line: no problem (and no exit under set -e)
  done
  return 0
}
bad=$(skip_problems "$root/root/diffusion.c/build/tests")
if [ -n "$bad" ]; then
  echo "fresh_root: tests skipped for something a fresh clone should have:" >&2
  echo "$bad" >&2
  status=1
fi
grep -qE "^[0-9]+ passed, 0 failed, " "$logs/test.log" || { echo "fresh_root: the test suite's summary is missing or not clean" >&2; status=1; }

echo
echo "A fresh Debian 12 root (minbase), the README's two commands, $(nproc) cores:"
total=0
for i in "${!step_names[@]}"; do
  printf '  %-58s %5d s\n' "${step_names[i]}" "${step_secs[i]}"
  total=$((total + step_secs[i]))
done
printf '  %-58s %5d s\n' "total" "$total"
echo "logs: $logs"
[ $status = 0 ] && echo "fresh root: both commands worked" || echo "fresh root: FAILED"
exit $status
