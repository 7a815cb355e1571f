"""Start N copies of a training script and give each its rank, as torchrun does.

    python -m pycyxwiz.launch --nproc-per-node 4 train.py --epochs 3
    python -m pycyxwiz.launch --nproc-per-node 2 -m mypkg.train
    python -m pycyxwiz.launch --nproc-per-node 2 -- python train.py

What each rank sees, how failures and signals are handled and how to run on several nodes:
docs/launching.md. Standard library only: the launcher never touches the compiled core.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import BinaryIO, Sequence

from ._procgroup import Watchdog, group_alive, stop_groups, wait_unreaped

if os.name == "nt":  # job objects and console process groups in place of sessions (see _winjob)
    from . import _winjob

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 29500
DEFAULT_KILL_TIMEOUT = 10.0
TAIL_LINES = 10  # stderr lines of a failed rank repeated in the failure summary
MAX_LINE = 1 << 16  # a longer line is forwarded in pieces rather than held in memory

# Rank variables of other launchers: cx.distributed.init() reads RANK/WORLD_SIZE first anyway, but a
# launcher started inside an srun/mpirun allocation must not hand its ranks a second, wrong identity.
FOREIGN_RANK_VARS = (
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK", "PMI_SIZE",
)
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")  # SIGBREAK: Windows' Ctrl+Break
SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL: Rank.kill() ends the rank's job there
FORWARDED_AS = "" if os.name != "nt" else " as CTRL_BREAK_EVENT"  # how the ranks get a signal, for the log

USAGE = ("python -m pycyxwiz.launch --nproc-per-node N [--nnodes M] [--node-rank K] [--master-addr A]\n"
         "       [--master-port P] [--job-id ID] [--max-restarts R] [--kill-timeout S] [--no-prefix]\n"
         "       [--] (script.py | -m module | command) [args...]")


class LaunchError(Exception):
    """A problem found before any rank starts; printed as one line, exit status 1."""


# ------------------------------------------------------------------------------------------ options


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1..65535, got {text!r}")
    return int(text)


def port_number(name: str, text: str) -> int:
    """The port in variable (or argument) `name`; ValueError worded as cx.distributed.init() words it."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):  # int() would take " 80", "8_0" and non-ASCII digits
        raise ValueError(f"{name}={text!r} is not an integer: expected a TCP port, 1..65535")
    if not 1 <= int(text) <= 65535:
        raise ValueError(f"{name}={text!r} is out of range: expected a TCP port, 1..65535")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def _parser() -> tuple[argparse.ArgumentParser, set[str]]:
    """The parser, and the option strings that take a value (to find where TARGET starts)."""
    parser = argparse.ArgumentParser(
        prog="python -m pycyxwiz.launch", usage=USAGE, allow_abbrev=False,
        description="Start N ranks of a training script on this node.",
        epilog="TARGET: a script.py (run with this Python), -m module, or a command run as given "
               "(e.g. python train.py). Everything after TARGET goes to it. See docs/launching.md.")
    takes_value: set[str] = set()

    def option(*names: str, **kwargs) -> None:
        parser.add_argument(*names, **kwargs)
        if "action" not in kwargs:
            takes_value.update(names)

    option("--nproc-per-node", "--nproc_per_node", type=_int_at_least(1), required=True, metavar="N",
           help="processes to start on this node")
    option("--nnodes", type=_int_at_least(1), default=1, metavar="M", help="number of nodes (default 1)")
    option("--node-rank", "--node_rank", type=_int_at_least(0), default=0, metavar="K",
           help="this node's index, 0..M-1 (default 0)")
    option("--master-addr", "--master_addr", metavar="A",
           help=f"address of node 0 (default: $MASTER_ADDR, else {DEFAULT_ADDR})")
    option("--master-port", "--master_port", type=_port, metavar="P",
           help=f"port of rank 0 (default: $MASTER_PORT, else {DEFAULT_PORT} or a free port if that is busy)")
    option("--job-id", metavar="ID", help="id shared by all ranks of the job (default: $CYXWIZ_JOB_ID, "
           "else random on one node, derived from master address and port on several)")
    option("--max-restarts", "--max_restarts", type=_int_at_least(0), default=0, metavar="R",
           help="restart the whole group up to R times after a failure (default 0)")
    option("--kill-timeout", type=_seconds, default=DEFAULT_KILL_TIMEOUT, metavar="S",
           help=f"seconds between SIGTERM/SIGINT and SIGKILL when stopping ranks (default {DEFAULT_KILL_TIMEOUT:g})")
    option("--no-prefix", action="store_true", help="forward output without the '[rank R] ' prefix")
    option("-m", "--module", action="store_true", help="TARGET is a module, run as python -m TARGET")
    return parser, takes_value


def _split_target(argv: Sequence[str], takes_value: set[str]) -> tuple[list[str], list[str]]:
    """Launcher options | TARGET and its arguments: everything from TARGET on belongs to the script."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return list(argv[:i]), list(argv[i + 1:])
        if not word.startswith("-") or word == "-":
            break
        i += 2 if word in takes_value else 1  # "--opt value" vs "--opt=value" or a flag
    return list(argv[:i]), list(argv[i:])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser, takes_value = _parser()
    own, rest = _split_target(argv, takes_value)
    opts = parser.parse_args(own)
    if not rest:
        parser.error("missing TARGET: a script.py, -m module, or a command")
    if opts.node_rank >= opts.nnodes:
        parser.error(f"--node-rank must be in [0, {opts.nnodes}) for --nnodes {opts.nnodes}, got {opts.node_rank}")
    opts.target, opts.args = rest[0], rest[1:]
    try:
        opts.command = target_command(opts.target, opts.args, opts.module)
    except LaunchError as e:
        parser.error(str(e))
    return opts


def target_command(target: str, args: list[str], module: bool) -> list[str]:
    if module:
        return [sys.executable, "-u", "-m", target, *args]
    if target.endswith(".py") and os.path.isfile(target):
        return [sys.executable, "-u", target, *args]
    if shutil.which(target) is None:
        raise LaunchError(f"{target}: no such script or command (TARGET is a script.py, -m module or a command)")
    return [target, *args]


# ------------------------------------------------------------------------------ master port, job id


def _can_bind(port: int, reuse: bool = False) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if reuse:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def master_endpoint(opts: argparse.Namespace) -> tuple[str, int, bool]:
    """(address, port, port_was_chosen_by_user), from the options, then the environment, then defaults."""
    addr = opts.master_addr or os.environ.get("MASTER_ADDR") or DEFAULT_ADDR
    if opts.master_port is not None:
        return addr, opts.master_port, True
    env_port = os.environ.get("MASTER_PORT")
    if env_port:
        try:
            return addr, port_number("MASTER_PORT", env_port), True
        except ValueError as e:
            raise LaunchError(str(e)) from None
    return addr, DEFAULT_PORT, False


def check_port(port: int, explicit: bool, log) -> int:
    """On one node, make sure rank 0 can listen on the port (another node's port cannot be checked here)."""
    if _can_bind(port):
        return port
    if not explicit:
        free = _free_port()
        log(f"INFO: port {port} is in use; using free port {free} instead (choose one with --master-port)")
        return free
    # Connections of a job that just ended linger in TIME_WAIT and block a plain bind for a minute,
    # but not a listener with SO_REUSEADDR; only a live listener means another job has the port.
    if os.name != "nt" and _can_bind(port, reuse=True):
        return port
    raise LaunchError(f"master port {port} is already in use on this machine (another job?): "
                      f"stop that job or pick another port with --master-port")


def base_job_id(opts: argparse.Namespace, addr: str, port: int) -> str:
    if opts.job_id:
        return opts.job_id
    if os.environ.get("CYXWIZ_JOB_ID"):
        return os.environ["CYXWIZ_JOB_ID"]
    if opts.nnodes > 1:  # every node must agree without talking: hand-typed commands still match
        return hashlib.sha256(f"{addr}:{port}".encode()).hexdigest()[:16]
    return secrets.token_hex(8)


def attempt_job_id(base: str, attempt: int) -> str:
    """A new id per restart that every node computes alike, so old and new attempts never mix."""
    return base if attempt == 0 else hashlib.sha256(f"{base}/{attempt}".encode()).hexdigest()[:16]


def job_secret(opts: argparse.Namespace) -> str | None:
    """The job's CYXWIZ_SECRET: the user's (set, even empty, it wins), else a fresh random one made by
    node 0, which prints it in the other nodes' command lines; None on another node without one."""
    if "CYXWIZ_SECRET" in os.environ:
        return os.environ["CYXWIZ_SECRET"]
    return secrets.token_hex(32) if opts.node_rank == 0 else None


def rank_env(opts: argparse.Namespace, local_rank: int, addr: str, port: int, job_id: str,
             attempt: int, secret: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_RANK_VARS}
    if secret is not None:
        env["CYXWIZ_SECRET"] = secret
    n, k = opts.nproc_per_node, opts.node_rank
    env.update(RANK=str(k * n + local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(opts.nnodes * n),
               LOCAL_WORLD_SIZE=str(n), NODE_RANK=str(k), GROUP_RANK=str(k), MASTER_ADDR=addr,
               MASTER_PORT=str(port), CYXWIZ_JOB_ID=job_id, CYXWIZ_RESTART_COUNT=str(attempt),
               TORCHELASTIC_RESTART_COUNT=str(attempt), PYTHONUNBUFFERED="1")
    return env


# ------------------------------------------------------------------------------------------- output


class Output:
    """Whole lines from every rank onto our stdout/stderr, one line at a time, never half a line."""

    def __init__(self, prefix: bool) -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._dead: set[BinaryIO] = set()  # streams whose reader went away (a closed pipe)
        self._closed = False

    def write(self, stream: BinaryIO, rank: int | None, line: bytes) -> None:
        if rank is not None and self._prefix:
            line = b"[rank %d] " % rank + (line if line.endswith(b"\n") else line + b"\n")
        with self._lock:
            if self._closed or stream in self._dead:
                return  # dropped, but the ranks' pipes are still drained so they never block
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):
                self._dead.add(stream)

    def log(self, message: str) -> None:
        self.write(sys.stderr.buffer, None, f"[launch] {message}\n".encode("utf-8", "replace"))

    def close(self) -> None:
        """Drop what threads still forward, so none holds a stream while the interpreter exits."""
        with self._lock:
            self._closed = True


def _pump(pipe: BinaryIO, out: Output, stream: BinaryIO, rank: int, tail: deque | None) -> None:
    with pipe:
        for line in iter(lambda: pipe.readline(MAX_LINE), b""):
            if tail is not None:
                tail.append(line)
            out.write(stream, rank, line)


def _quote(command: Sequence[str]) -> str:
    return subprocess.list2cmdline(command) if os.name == "nt" else shlex.join(command)


# ------------------------------------------------------------------------------------ signals, ranks


class Signals:
    """Records SIGINT/SIGTERM/SIGHUP for the main loop, which forwards them to the ranks itself."""

    def __init__(self) -> None:
        self.received: list[int] = []
        for name in FORWARDED_SIGNALS:
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), lambda signum, frame: self.received.append(signum))


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Rank:
    def __init__(self, rank: int, local_rank: int, command: list[str], env: dict[str, str], out: Output) -> None:
        self.rank, self.local_rank = rank, local_rank
        # Own session: a terminal's Ctrl-C reaches only the launcher, which forwards exactly one signal
        # to the rank's whole process group (as torchrun does), so nothing gets it twice. Windows: its
        # own console process group (the console's Ctrl+C is disabled there) and job object (_winjob).
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=os.name != "nt",
                                     creationflags=_winjob.CREATE_NEW_PROCESS_GROUP if os.name == "nt" else 0)
        self.job = _winjob.new_job(self.proc.pid) if os.name == "nt" else None
        self.tail: deque[bytes] = deque(maxlen=TAIL_LINES)
        self.readers = [
            threading.Thread(target=_pump, args=(pipe, out, stream, rank, tail), daemon=True)
            for pipe, stream, tail in ((self.proc.stdout, sys.stdout.buffer, None),
                                       (self.proc.stderr, sys.stderr.buffer, self.tail))
        ]
        for reader in self.readers:
            reader.start()

    def send(self, signum: int) -> None:
        try:
            if os.name != "nt":
                os.killpg(self.proc.pid, signum)
            # Windows: whatever the signal, CTRL_BREAK_EVENT to the rank's console process group while
            # the rank (its leader) runs; where no console delivers it, the rank is ended at once.
            elif self.proc.poll() is None and not _winjob.ctrl_break(self.proc.pid):
                self.kill()
        except OSError:  # exited meanwhile
            pass

    def kill(self) -> None:
        """SIGKILL to its process group; Windows: the end of its job (the rank and what it started)."""
        if os.name != "nt":
            self.send(SIGKILL)
            return
        try:
            if self.job is not None:
                self.job.terminate()
            else:
                self.proc.kill()
        except OSError:  # exited meanwhile
            pass

    def describe(self) -> str:
        return f"rank {self.rank} (local {self.local_rank}, pid {self.proc.pid})"


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal s: 128+s, as a shell


class Group:
    """One attempt: all local ranks, started together, stopped together."""

    def __init__(self, commands: list[tuple[int, int, list[str], dict[str, str]]], out: Output,
                 signals: Signals, kill_timeout: float, watchdog: Watchdog) -> None:
        self.out, self.signals, self.kill_timeout, self.watchdog = out, signals, kill_timeout, watchdog
        self.exits: queue.Queue[tuple[Rank, int]] = queue.Queue()
        self.ranks: list[Rank] = []
        self.running: list[Rank] = []
        for rank, local_rank, command, env in commands:
            try:
                r = Rank(rank, local_rank, command, env, out)
            except OSError as e:
                self.stop(signal.SIGTERM)
                self.sweep()
                raise LaunchError(f"cannot start rank {rank}: {command[0]}: {e.strerror or e}") from None
            watchdog.watch(r.proc.pid)
            self.ranks.append(r)
            self.running.append(r)
            # A waiter per rank reports exits in the order they happen: the first failure is the cause.
            # It leaves the rank unreaped until sweep(), so the id of its process group stays ours.
            threading.Thread(target=lambda r=r: self.exits.put((r, wait_unreaped(r.proc.pid, r.proc.wait))),
                             daemon=True).start()

    def _collect(self, timeout: float) -> list[tuple[Rank, int]]:
        done = []
        try:
            done.append(self.exits.get(timeout=timeout))
            while True:
                done.append(self.exits.get_nowait())
        except queue.Empty:
            pass
        for r, _ in done:
            self.running.remove(r)
        return done

    def stop(self, signum: int) -> None:
        """signum to every running rank; SIGKILL after kill_timeout or at a second signal to us."""
        seen = len(self.signals.received)
        for r in self.running:
            r.send(signum)
        deadline = time.monotonic() + self.kill_timeout
        while self.running and time.monotonic() < deadline and len(self.signals.received) == seen:
            self._collect(0.05)
        if self.running:
            why = (f"still running {self.kill_timeout:g}s after {signal_name(signum)}"
                   if len(self.signals.received) == seen else "a second signal to the launcher")
            self.out.log(f"killing {', '.join(r.describe() for r in self.running)}: {why}")
            for r in self.running:
                r.kill()
            deadline = time.monotonic() + 5.0  # SIGKILL cannot be caught; only a hung kernel call delays it
            while self.running and time.monotonic() < deadline:
                self._collect(0.05)

    def sweep(self) -> None:
        """At the end of an attempt, however it ended: stop what is left in every rank's process group,
        also of ranks that exited (their children), SIGKILL after kill_timeout or a second signal."""
        if os.name == "nt":
            self._sweep_jobs()
            return
        seen = len(self.signals.received)
        left = [r for r in self.ranks if group_alive(r.proc.pid)]
        if left:
            self.out.log(f"stopping processes left running in the process group of "
                         f"{', '.join(r.describe() for r in left)} (SIGTERM, SIGKILL after {self.kill_timeout:g}s)")
            stop_groups([r.proc.pid for r in left], self.kill_timeout,
                        hurry=lambda: len(self.signals.received) != seen)
        for r in self.ranks:
            try:
                r.proc.wait(timeout=5.0)  # reaped only now: see wait_unreaped
            except subprocess.TimeoutExpired:
                pass
            self.watchdog.forget(r.proc.pid)

    def _sweep_jobs(self) -> None:
        """sweep() on Windows: what is left in a rank's job is terminated at once (the group such a
        process belongs to may have no leader left, so no CTRL_BREAK_EVENT is sent to it)."""
        left = [r for r in self.ranks if r.job is not None and r.job.active()]
        if left:
            self.out.log(f"terminating processes left running in the job object of "
                         f"{', '.join(r.describe() for r in left)}")
        for r in self.ranks:
            if r.job is not None:
                r.job.close()  # KILL_ON_JOB_CLOSE: what is left in it ends
            try:
                r.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass

    def run(self) -> int:
        """0, the first failed rank's exit status, or 128+signal for a signal to the launcher."""
        while self.running:
            if self.signals.received:
                signum = self.signals.received[0]
                self.out.log(f"got {signal_name(signum)}: forwarding it{FORWARDED_AS} to {len(self.running)} ranks "
                             f"(SIGKILL after {self.kill_timeout:g}s or at a second signal)")
                self.stop(signum)
                return 128 + signum
            for r, returncode in self._collect(0.1):
                if returncode != 0:
                    self._report(r, returncode)
                    self.stop(signal.SIGTERM)
                    return exit_status(returncode)
        return 0

    def _report(self, r: Rank, returncode: int) -> None:
        if returncode < 0:
            how = f"was killed by {signal_name(-returncode)} (exit status {exit_status(returncode)})"
        else:
            how = f"failed with exit code {returncode}"
        others = len(self.running)
        rest = f"stopping the other {others} rank{'s' if others != 1 else ''}" if others else "no other rank is running"
        self.out.log(f"{r.describe()} {how}; {rest}")
        r.readers[1].join(timeout=2.0)  # its last stderr lines, which name the cause
        if r.tail:
            self.out.log(f"last lines of rank {r.rank}'s stderr:")
            for line in r.tail:
                self.out.log("  " + line.decode("utf-8", "replace").rstrip("\r\n"))
        else:
            self.out.log(f"rank {r.rank} wrote nothing to stderr")

    def join_output(self, timeout: float) -> None:
        """Let the readers forward what the ranks wrote last (a grandchild may hold a pipe open: not forever)."""
        deadline = time.monotonic() + timeout
        for r in self.ranks:
            for reader in r.readers:
                reader.join(timeout=max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------------------------- main


def other_node_commands(opts: argparse.Namespace, addr: str, port: int, job_id: str,
                        secret: str | None = None) -> list[str]:
    extra = []
    if opts.max_restarts:
        extra += ["--max-restarts", str(opts.max_restarts)]
    if opts.kill_timeout != DEFAULT_KILL_TIMEOUT:
        extra += ["--kill-timeout", f"{opts.kill_timeout:g}"]
    if opts.no_prefix:
        extra.append("--no-prefix")
    target = (["-m"] if opts.module else ["--"] if opts.target.startswith("-") else []) + [opts.target, *opts.args]
    # The secret travels in the environment, not on the command line, where `ps` would show it.
    env = "" if secret is None else (f"set CYXWIZ_SECRET={secret}&& " if os.name == "nt" else f"CYXWIZ_SECRET={secret} ")
    return [env + _quote(["python", "-m", "pycyxwiz.launch", "--nproc-per-node", str(opts.nproc_per_node),
                          "--nnodes", str(opts.nnodes), "--node-rank", str(k), "--master-addr", addr,
                          "--master-port", str(port), "--job-id", job_id, *extra, *target])
            for k in range(1, opts.nnodes)]


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    out = Output(prefix=not opts.no_prefix)
    signals = Signals()  # before any rank starts, so no signal falls between the cracks
    if os.name == "nt":  # Windows: the ranks, and what they start, are in a job that ends with us (_winjob)
        _winjob.enter_own_job()
    # Stops the ranks should this process be killed without a chance to (SIGKILL, the OOM killer).
    watchdog = Watchdog(opts.kill_timeout, f"[launch] the launcher (pid {os.getpid()})")
    try:
        return _launch(opts, out, signals, watchdog)
    except LaunchError as e:
        out.log(f"error: {e}")
        return 1
    finally:
        watchdog.close()
        out.close()


def _launch(opts: argparse.Namespace, out: Output, signals: Signals, watchdog: Watchdog) -> int:
    n, m, node = opts.nproc_per_node, opts.nnodes, opts.node_rank
    addr, port, explicit = master_endpoint(opts)
    if m > 1 and (addr in ("localhost", "::1") or addr.startswith("127.")):
        out.log(f"WARNING: master address {addr} is a loopback address: the other {m - 1} node(s) cannot "
                f"reach it; pass node 0's network address with --master-addr")
    base = None
    status = 0
    secret = job_secret(opts)
    if secret is None:
        out.log("INFO: CYXWIZ_SECRET is not set: run the command that node 0's launcher printed, which sets it")
    for attempt in range(opts.max_restarts + 1):
        if m == 1:
            port = check_port(port, explicit, out.log)
        if base is None:
            base = base_job_id(opts, addr, port)
            if m > 1 and node == 0:
                made = "CYXWIZ_SECRET" not in os.environ  # the user's own secret is never printed
                for k, line in enumerate(other_node_commands(opts, addr, port, base, secret if made else None), start=1):
                    out.log(f"on node {k} run: {line}")
        job_id = attempt_job_id(base, attempt)
        first = node * n
        out.log(f"INFO: ranks {first}..{first + n - 1} of world size {m * n} (node {node} of {m}), "
                f"master {addr}:{port}, job id {job_id}, restart {attempt}; command: {_quote(opts.command)}")
        group = Group([(first + i, i, opts.command, rank_env(opts, i, addr, port, job_id, attempt, secret))
                       for i in range(n)], out, signals, opts.kill_timeout, watchdog)
        try:
            status = group.run()
        finally:
            group.sweep()
        group.join_output(timeout=2.0)
        if signals.received:  # the user's Ctrl-C/SIGTERM, even one during a failure, never restarts
            return 128 + signals.received[0]
        if status == 0:
            return 0
        if attempt < opts.max_restarts:
            out.log(f"restarting all {n} ranks: restart {attempt + 1} of {opts.max_restarts}")
    if opts.max_restarts:
        out.log(f"giving up after {opts.max_restarts} restart{'s' if opts.max_restarts != 1 else ''}")
    return status


if __name__ == "__main__":
    sys.exit(main())
