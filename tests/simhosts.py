"""Simulated hosts for multi-host tests and benchmarks (the Python form of shared/tools/simhosts.sh).

A host is a network namespace plus its own IPC namespace and its own /dev/shm (a mount namespace with
a private tmpfs): ranks on different hosts meet only through the network, as on separate machines,
while ranks on one host share memory. Two network namespaces alone would still share /dev/shm and
IPC, and the ranks would take them for one host.

    with SimHosts(rate="1gbit") as hosts:               # hosts A (10.78.X.1) and B (10.78.X.2), one veth pair
                                                        # (n=3 or more: each host's veth to a bridge)
        p = hosts.popen_on(hosts.names[0], [sys.executable, "x.py"], env)
        hosts.tx_bytes(hosts.names[0])                  # bytes host A sent over its link
        hosts.set_link("down")                          # the cable is cut (both ends)

Needs root, iproute2 (ip, tc) and util-linux (unshare, nsenter); `Unavailable` says why not.
`hosts_or_skip()` turns that into pytest.skip. Cleanup kills every process in the hosts and removes
the namespaces, mounts and folders, also after a failed setup.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time

_counter = itertools.count()
RUN_DIR = "/run"


class Unavailable(RuntimeError):
    """Simulated hosts cannot be made here (not root, a tool missing, namespaces refused)."""


def _run(argv: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res


def why_unavailable() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "simulated hosts need root (network, IPC and mount namespaces)"
    for tool in ("ip", "tc", "unshare", "nsenter", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, util-linux)"
    return None


class SimHosts:
    """n simulated hosts: names[i] has address addrs[i] (10.78.X.i+1/24) on its veth veths[i]. Two are
    joined by one veth pair; more each by a veth to a bridge in a switch namespace of their own."""

    def __init__(self, n: int = 2, rate: str | None = None):
        if not 2 <= n <= 26:
            raise ValueError(f"SimHosts makes 2..26 hosts, not {n}")
        k = next(_counter)
        tag = f"{os.getpid() % 100000}x{k}"
        self.dir = f"{RUN_DIR}/cxhosts.{tag}"
        letters = "abcdefghijklmnopqrstuvwxyz"[:n]
        self.names = [f"cxh{tag}{c}" for c in letters]
        self.veths = [f"cxv{tag}{c}"[:15] for c in letters]
        self.switch = f"cxh{tag}sw" if n > 2 else None
        self._ports = [f"cxp{tag}{c}"[:15] for c in letters]  # the switch's ends of the veths
        x = (os.getpid() + k) % 250 + 1  # not 10.77.X: test_multihost_netns.py's
        self.addrs = [f"10.78.{x}.{i + 1}" for i in range(n)]
        self.rate = rate
        self._netns: list[str] = []
        self._ns_files: list[str] = []
        self._dir_mounted = False
        self._veth_in_root = False

    # -------------------------------------------------------------- setup and cleanup

    def __enter__(self) -> "SimHosts":
        why = why_unavailable()
        if why:
            raise Unavailable(why)
        try:
            self._setup()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def _setup(self) -> None:
        # The namespace files must live on a private mount, or a mount namespace could hold itself.
        os.makedirs(self.dir)
        if _run(["mount", "--bind", self.dir, self.dir], check=False).returncode != 0:
            raise Unavailable(f"cannot bind-mount {self.dir} (no CAP_SYS_ADMIN?)")
        self._dir_mounted = True
        _run(["mount", "--make-private", self.dir])
        for ns in self.names:
            res = _run(["ip", "netns", "add", ns], check=False)
            if res.returncode != 0:
                raise Unavailable(f"cannot create a network namespace here (ip netns add: {res.stderr.strip()})")
            self._netns.append(ns)
        if self.switch is None:
            self._veth(self.veths[0], self.names[0], self.veths[1], self.names[1])
        else:
            _run(["ip", "netns", "add", self.switch])
            self._netns.append(self.switch)
            _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for ns, dev, port in zip(self.names, self.veths, self._ports):
                self._veth(dev, ns, port, self.switch)
                _run(["ip", "-n", self.switch, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", self.switch, "link", "set", port, "up"])
                if self.rate:  # what the switch sends to the host: the other direction of its cable
                    _run(["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", port, "root", "tbf",
                          "rate", self.rate, "burst", "256kb", "latency", "50ms"])
        for ns, dev, addr in zip(self.names, self.veths, self.addrs):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            if self.rate:
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                      "burst", "256kb", "latency", "50ms"])
        for ns in self.names:
            ipc, mnt = self._ipc(ns), self._mnt(ns)
            for f in (ipc, mnt):
                open(f, "w").close()
                self._ns_files.append(f)
            # Persistent IPC and mount namespaces (bind-mounted on the files), with a tmpfs on /dev/shm.
            res = _run(["unshare", f"--ipc={ipc}", f"--mount={mnt}", "--propagation", "private",
                        "sh", "-c", "mount -t tmpfs -o size=4g,mode=1777 cxshm /dev/shm"], check=False)
            if res.returncode != 0:
                raise Unavailable(f"cannot make IPC and mount namespaces (unshare: {res.stderr.strip()})")

    def _veth(self, a: str, ns_a: str, b: str, ns_b: str) -> None:
        """A veth pair a <-> b, its ends moved into ns_a and ns_b."""
        res = _run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=False)
        if res.returncode != 0:
            raise Unavailable(f"cannot create a veth pair here: {res.stderr.strip()}")
        self._veth_in_root = a
        _run(["ip", "link", "set", a, "netns", ns_a])
        _run(["ip", "link", "set", b, "netns", ns_b])
        self._veth_in_root = False

    def cleanup(self) -> None:
        """Kills everything in the hosts, then removes namespaces, mounts and the folder; never raises."""
        for _ in range(3):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            if not pids:
                break
            time.sleep(0.2)
        for f in reversed(self._ns_files):
            _run(["umount", f], check=False)
        self._ns_files = []
        for ns in self._netns:  # deleting a namespace deletes its end of the veth, and so the pair
            _run(["ip", "netns", "del", ns], check=False)
        self._netns = []
        if self._veth_in_root:
            _run(["ip", "link", "del", self._veth_in_root], check=False)
            self._veth_in_root = False
        if self._dir_mounted:
            _run(["umount", self.dir], check=False)
            self._dir_mounted = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """Processes in the hosts' network namespaces (of ours: nobody else enters them)."""
        found = []
        for ns in self._netns:
            res = _run(["ip", "netns", "pids", ns], check=False)
            found += [int(p) for p in res.stdout.split() if p.isdigit()]
        return found

    # -------------------------------------------------------------- using the hosts

    def _ipc(self, ns: str) -> str:
        return f"{self.dir}/ipc_{ns}"

    def _mnt(self, ns: str) -> str:
        return f"{self.dir}/mnt_{ns}"

    def argv_on(self, host: str, argv: list, cwd: str | None = None) -> list[str]:
        """`argv` run on `host` (entering a mount namespace resets the working folder: `cwd` sets it)."""
        wd = [f"--wd={cwd}"] if cwd else []
        return ["nsenter", f"--net=/run/netns/{host}", f"--ipc={self._ipc(host)}", f"--mount={self._mnt(host)}",
                *wd, "--", *[str(a) for a in argv]]

    def popen_on(self, host: str, argv: list, env: dict[str, str], **kw) -> subprocess.Popen:
        """Starts `argv` on `host` in a session of its own, output piped (text)."""
        cwd = kw.pop("cwd", None)
        return subprocess.Popen(self.argv_on(host, argv, cwd), env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, **kw)

    def set_link(self, state: str, hosts: list[str] | None = None) -> None:
        """Takes the veth ends of `hosts` (default: all of them) "down" or "up"."""
        for ns, dev in zip(self.names, self.veths):
            if hosts is None or ns in hosts:
                _run(["ip", "-n", ns, "link", "set", dev, state])

    def tx_bytes(self, host: str) -> int:
        """Bytes `host` has sent over its veth (frames with their headers), from the kernel's counters."""
        dev = self.veths[self.names.index(host)]
        res = _run(["ip", "-n", host, "-j", "-s", "link", "show", "dev", dev])
        return int(json.loads(res.stdout)[0]["stats64"]["tx"]["bytes"])

    def shm_files(self, host: str, pattern: str = "cyxwiz") -> list[str]:
        """Names in `host`'s /dev/shm starting with `pattern`."""
        res = _run(self.argv_on(host, ["ls", "-A", "/dev/shm"]))
        return sorted(n for n in res.stdout.split() if n.startswith(pattern))


def hosts_or_skip(**kw) -> SimHosts:
    """SimHosts(**kw) entered, or pytest.skip with the reason they cannot be made here."""
    import pytest

    try:
        return SimHosts(**kw).__enter__()
    except Unavailable as e:
        pytest.skip(str(e))
