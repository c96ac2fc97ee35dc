#!/usr/bin/env bash
# Boots Debian 12's stock kernel (linux-image-amd64, 6.1) under QEMU with TCG
# and runs one command in it as root, for tests of kernel features the host's
# kernel lacks (kprobes, fentry trampolines). See tests/qemu/README.md.
#
#   guest.sh prepare
#       Fills the cache (vmlinuz and a static busybox, both downloaded with
#       `apt-get download` and extracted, never installed). Does nothing when
#       they are there already.
#
#   guest.sh run [--timeout SECS] [--mem MB] [--smp N] [--verbose]
#                [--file HOSTPATH[:GUESTPATH]]... [--env NAME=VALUE]...
#                -- COMMAND [ARGS...]
#       Boots with an initramfs holding busybox, the files (and the shared
#       libraries their ELF files need) and an /init that runs COMMAND.
#       COMMAND's stdout and stderr (merged, in order) come out on stdout;
#       guest.sh exits with COMMAND's exit status. Its own errors go to
#       stderr, with the exit status 124 on a timeout and 125 when the guest
#       stopped without reporting COMMAND's status.
#
# The cache is $WEFT_GUEST_CACHE, by default ${CARGO_TARGET_DIR:-<repo>/target}/qemu-guest.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)
cache=${WEFT_GUEST_CACHE:-${CARGO_TARGET_DIR:-$repo/target}/qemu-guest}
qemu='qemu-system-x86_64'

die() {
  printf 'guest.sh: %s\n' "$*" >&2
  exit 1
}

usage() {
  cat >&2 <<'EOF'
usage: guest.sh prepare
       guest.sh run [--timeout SECS] [--mem MB] [--smp N] [--verbose]
                    [--file HOSTPATH[:GUESTPATH]]... [--env NAME=VALUE]...
                    -- COMMAND [ARGS...]
EOF
  exit 2
}

# ---------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------

ready() {
  [[ -s $cache/vmlinuz && -x $cache/busybox && -s $cache/kernel-release ]]
}

# apt-get download PACKAGE into the current directory. As root, apt drops to
# the _apt user for downloads, which cannot write to a private temp dir.
apt_download() {
  local opts=(-q)
  if [[ $EUID -eq 0 ]]; then
    opts+=(-o APT::Sandbox::User=root)
  fi
  apt-get "${opts[@]}" download "$1" >/dev/null ||
    die "apt-get download $1 failed (no network, or stale package lists: try apt-get update)"
}

prepare() {
  local missing=()
  command -v "$qemu" >/dev/null || missing+=("$qemu (apt-get install qemu-system-x86)")
  if ! ready; then
    command -v apt-get >/dev/null || missing+=("apt-get (a Debian or Debian-based host)")
    command -v dpkg-deb >/dev/null || missing+=("dpkg-deb (apt-get install dpkg)")
  fi
  if [[ ${#missing[@]} -gt 0 ]]; then
    printf 'guest.sh: missing: %s\n' "${missing[@]}" >&2
    exit 1
  fi
  mkdir -p "$cache"
  # Two test processes may prepare at once; the second waits for the first.
  exec 9>"$cache/.lock"
  flock 9
  if ready; then
    return 0
  fi

  local tmp
  tmp=$(mktemp -d "$cache/prepare.XXXXXX")
  # shellcheck disable=SC2064 # $tmp is fixed now
  trap "rm -rf '$tmp'" EXIT

  # The kernel package the metapackage points at (linux-image-6.1.0-N-amd64).
  local kpkg
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *|\{0,1\}Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n 1) || true
  [[ -n $kpkg ]] ||
    die "apt knows no linux-image-amd64 (not a Debian 12 host, or no package lists: try apt-get update)"
  [[ $kpkg == linux-image-6.1.* ]] ||
    die "linux-image-amd64 depends on $kpkg, expected linux-image-6.1.*-amd64 (Debian 12 bookworm)"

  echo "guest.sh: downloading $kpkg and busybox-static into $cache" >&2
  (cd "$tmp" && apt_download "$kpkg" && apt_download busybox-static)

  mkdir "$tmp/k" "$tmp/b"
  dpkg-deb -x "$tmp/$kpkg"_*.deb "$tmp/k"
  dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/b"
  local vmlinuz release
  vmlinuz=$(find "$tmp/k/boot" -maxdepth 1 -name 'vmlinuz-*' | head -n 1)
  [[ -n $vmlinuz ]] || die "$kpkg holds no /boot/vmlinuz-*"
  release=${vmlinuz##*/vmlinuz-}
  [[ -x $tmp/b/bin/busybox ]] || die "busybox-static holds no /bin/busybox"
  "$tmp/b/bin/busybox" true || die "the downloaded busybox does not run on this host"

  cp "$vmlinuz" "$cache/vmlinuz.new"
  cp "$tmp/k/boot/config-$release" "$cache/config" 2>/dev/null || true
  cp "$tmp/b/bin/busybox" "$cache/busybox.new"
  mv "$cache/vmlinuz.new" "$cache/vmlinuz"
  mv "$cache/busybox.new" "$cache/busybox"
  echo "$release" >"$cache/kernel-release"
  rm -rf "$tmp"
  trap - EXIT
  echo "guest.sh: ready: kernel $release in $cache" >&2
}

# ---------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------

# One argument, single-quoted for /bin/sh (any byte but NUL survives).
sh_quote() {
  local q="'\\''"
  printf "'%s'" "${1//\'/$q}"
}

is_elf() {
  local magic=''
  [[ -f $1 && -r $1 ]] || return 1
  LC_ALL=C IFS= read -r -n 4 magic <"$1" 2>/dev/null || true
  [[ $magic == $'\x7fELF' ]]
}

# Copies host path $1 to $root$2 as it is (a directory with its contents; a
# symlink given on the command line is followed).
put() {
  local src=$1 dst=$root$2
  mkdir -p "$(dirname "$dst")"
  if [[ -d $src ]]; then
    rm -rf "$dst"
    cp -a -H "$src" "$dst"
  else
    cp -L --preserve=mode,timestamps --remove-destination "$src" "$dst"
  fi
}

# Adds the shared libraries (and dynamic loader) host ELF file $1 needs, at
# the paths ldd reports, as regular files.
add_libs() {
  local line path
  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    case $line in
      *'=> not found'*)
        echo "guest.sh: warning: $1 needs ${line%% =>*}, which ldd cannot find" >&2
        continue
        ;;
      *'=> /'*) path=${line#*=> } ;;
      /*) path=$line ;;
      *) continue ;;
    esac
    path=${path%% (0x*}
    [[ -e $root$path ]] || put "$path" "$path"
  done < <(LC_ALL=C ldd "$1" 2>/dev/null || true)
}

run() {
  local timeout=300 mem=512 smp=2 verbose=0
  local files=() envs=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --timeout) [[ $# -ge 2 ]] || usage; timeout=$2; shift 2 ;;
      --mem) [[ $# -ge 2 ]] || usage; mem=$2; shift 2 ;;
      --smp) [[ $# -ge 2 ]] || usage; smp=$2; shift 2 ;;
      --file) [[ $# -ge 2 ]] || usage; files+=("$2"); shift 2 ;;
      --env) [[ $# -ge 2 ]] || usage; envs+=("$2"); shift 2 ;;
      --verbose) verbose=1; shift ;;
      --) shift; break ;;
      *) usage ;;
    esac
  done
  [[ $# -gt 0 ]] || usage
  [[ $timeout =~ ^[0-9]+$ && $timeout -gt 0 ]] || die "--timeout wants whole seconds, not '$timeout'"
  [[ $mem =~ ^[0-9]+$ ]] || die "--mem wants megabytes, not '$mem'"
  [[ $smp =~ ^[0-9]+$ ]] || die "--smp wants a number of CPUs, not '$smp'"
  command -v "$qemu" >/dev/null || die "$qemu not found: apt-get install qemu-system-x86"
  ready || die "no kernel in $cache: run 'guest.sh prepare' first"

  work=$(mktemp -d "${TMPDIR:-/tmp}/weft-guest.XXXXXX")
  qpid=
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  root=$work/root

  # busybox; /init links its applets where the files given leave room.
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,root,etc,run}
  cp "$cache/busybox" "$root/bin/busybox"

  local spec host guest
  for spec in "${files[@]}"; do
    host=$spec
    guest=
    if [[ $spec == *:/* ]]; then
      host=${spec%:/*}
      guest=/${spec##*:/}
    fi
    [[ -e $host ]] || die "--file $spec: no such file: $host"
    [[ -n $guest ]] || guest=$(realpath -s "$host")
    put "$host" "$guest"
  done
  # The libraries are looked up from the host's copies (where RPATHs with
  # $ORIGIN point to the right places).
  local f
  for spec in "${files[@]}"; do
    host=$spec
    [[ $spec == *:/* ]] && host=${spec%:/*}
    while IFS= read -r -d '' f; do
      if is_elf "$f"; then
        add_libs "$f"
      fi
    done < <(find -H "$host" -type f -print0)
  done

  local env_lines='' e
  for e in "${envs[@]}"; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE, not '$e'"
    env_lines+="export ${e%%=*}=$(sh_quote "${e#*=}")"$'\n'
  done
  local cmd='' a
  for a in "$@"; do
    cmd+="$(sh_quote "$a") "
  done

  local token
  token=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  start_mark="@@weft-guest-start-$token@@"
  end_mark="@@weft-guest-exit-$token"

  cat >"$root/init" <<EOF
#!/bin/busybox sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
/bin/busybox mount -t proc proc /proc
# Links to busybox's applets (where the files given have none of that name).
/bin/busybox --install -s
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
chmod 755 /
chmod 1777 /tmp
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
ln -sf /proc/mounts /etc/mtab
echo 'root:x:0:0:root:/root:/bin/sh' >/etc/passwd
echo 'root:x:0:' >/etc/group
hostname weft-guest
ip link set lo up 2>/dev/null
# No kernel messages amid the command's output; bytes out as written.
dmesg -n 1
stty -opost -echo </dev/console 2>/dev/null
ulimit -l unlimited
cd /
$env_lines
echo '$start_mark'
$cmd</dev/null 2>&1
status=\$?
echo '$end_mark' "\$status@@"
# Full paths: the command's environment may have changed PATH.
/bin/busybox sync
/bin/busybox poweroff -f
EOF
  chmod 755 "$root/init"

  (cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
    "$cache/busybox" cpio -o -H newc -R 0:0 2>/dev/null) >"$work/initrd" ||
    die "building the initramfs failed"

  local console=$work/console qerr=$work/qemu.err
  # tsc=reliable: under TCG the kernel's TSC synchronisation check fails
  # ("Marking TSC unstable due to TSCs unsynchronized"), so it keeps time
  # with the HPET while the scheduler's clock (a thread's CPU time) runs
  # on the TSC, filtered: the two drift ~5% apart over milliseconds, which
  # no real machine with an invariant TSC does. With the flag both run on
  # the TSC, as on such a machine.
  "$qemu" -accel tcg -cpu max -m "$mem" -smp "$smp" -nographic -no-reboot -nic none \
    -kernel "$cache/vmlinuz" -initrd "$work/initrd" \
    -append "console=ttyS0 quiet loglevel=1 panic=-1 oops=panic softlockup_panic=1 tsc=reliable rdinit=/init" \
    </dev/null >"$console" 2>"$qerr" &
  qpid=$!
  local deadline=$((SECONDS + timeout)) timed_out=0 marks=$work/marks
  : >"$marks"
  while kill -0 "$qpid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      timed_out=1
      kill "$qpid" 2>/dev/null || true
      break
    fi
    record_host_marks "$console" "$marks"
    sleep 0.1
  done
  wait "$qpid" 2>/dev/null || true
  qpid=

  # The command's output: what came between the marks (the end mark may
  # follow output that did not end with a newline).
  local status
  status=$(LC_ALL=C awk -v start="$start_mark" -v end="$end_mark " -v out="$work/out" '
    !on { if (index($0, start)) on = 1; next }
    {
      i = index($0, end)
      if (i) {
        printf "%s", substr($0, 1, i - 1) >out
        rest = substr($0, i + length(end))
        sub(/@@.*/, "", rest)
        print rest
        found = 1
        exit
      }
      print >out
    }
    END { if (!found) print "" }' "$console")
  [[ -e $work/out ]] && cat "$work/out"
  sed 's/^/guest.sh: host-mark /' "$marks" >&2

  if [[ $verbose -eq 1 ]]; then
    echo "guest.sh: --- console ---" >&2
    cat "$console" >&2
    echo "guest.sh: --- end of console ---" >&2
  fi
  if [[ $status =~ ^[0-9]+$ ]]; then
    return "$status"
  fi
  if [[ $timed_out -eq 1 ]]; then
    echo "guest.sh: timed out after ${timeout}s; QEMU killed" >&2
  else
    echo "guest.sh: the guest stopped without reporting the command's exit status" >&2
  fi
  if [[ $verbose -eq 0 ]]; then
    echo "guest.sh: last lines of the console:" >&2
    tail -n 30 "$console" | sed 's/^/  | /' >&2
  fi
  if [[ -s $qerr ]]; then
    echo "guest.sh: QEMU said:" >&2
    sed 's/^/  | /' "$qerr" >&2
  fi
  if [[ $timed_out -eq 1 ]]; then
    return 124
  fi
  return 125
}

# What the emulated CPUs lost to the host so far, in ns: the time QEMU's
# threads waited for a host CPU (schedstat's run_delay) plus what the
# hypervisor stole from this machine's CPUs (/proc/stat). The guest's
# clocks follow the host's and run on through both, so a span the guest
# measures can hold up to this much time in which it did not run at all.
host_delay_ns() {
  local sum=0 f delay steal
  for f in /proc/"$qpid"/task/*/schedstat; do
    { read -r _ delay _ <"$f" && sum=$((sum + delay)); } 2>/dev/null || true
  done
  steal=$(awk '/^cpu /{print $9; exit}' /proc/stat)
  echo $((sum + steal * (1000000000 / clk_tck)))
}
clk_tck=$(getconf CLK_TCK)

# Host marks: a guest that prints `@@host-mark NAME@@` (then waits a few
# tenths of a second for the host to see it) gets NAME and host_delay_ns at
# that moment listed after its output (`guest.sh: host-mark NAME NS` on
# stderr), so that a test can tell how much of a span the host took.
record_host_marks() {
  local console=$1 marks=$2 seen name
  seen=$(wc -l <"$marks")
  while IFS= read -r name; do
    echo "$name $(host_delay_ns)" >>"$marks"
  done < <(tr -d '\r' <"$console" | grep -o '@@host-mark [A-Za-z0-9_.-]*@@' |
    sed -n "$((seen + 1)),\$ s/@@host-mark \(.*\)@@/\1/p")
}

cleanup() {
  if [[ -n ${qpid:-} ]]; then
    kill "$qpid" 2>/dev/null || true
    wait "$qpid" 2>/dev/null || true
  fi
  [[ -n ${work:-} ]] && rm -rf "$work"
}

case ${1:-} in
  prepare) shift; [[ $# -eq 0 ]] || usage; prepare ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
