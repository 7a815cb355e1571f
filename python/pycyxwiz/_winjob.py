"""Windows: job objects and console process groups, doing for the launcher (pycyxwiz.launch) and
spawn() what POSIX sessions and process groups do there (_procgroup): stop a rank together with what
it started, and end them all when the process that started them dies, however it dies.

- A Job here has JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: Windows terminates every process in it when the
  last handle to it closes. Only the process that made it holds a handle (not inheritable), so that
  happens when that process exits, also by TerminateProcess or a crash: Windows needs no watchdog
  process (_procgroup.Watchdog is a no-op there).
- A process started by a process in a job is in that job from its first instruction (breakaway is not
  allowed: neither JOB_OBJECT_LIMIT_BREAKAWAY_OK nor ..._SILENT_BREAKAWAY_OK is set, so a child asked
  for with CREATE_BREAKAWAY_FROM_JOB fails to start). A process put in a job after it started
  (AssignProcessToJobObject just after Popen returns: subprocess cannot start one suspended) is outside
  it for that moment, and so would be a child it started then. Hence the launcher puts itself in a job
  first (enter_own_job): its ranks, and all they start, are in that job from birth and end with the
  launcher, however it ends (on POSIX a process that calls setsid escapes; here nothing does). Each
  rank then goes, just after Popen, in a job of its own nested in the launcher's (Windows 8+), which
  stops the rank and what it started without touching the launcher; a child the rank started in the
  microseconds before that would be in the launcher's job only (ended with the launcher, not with the
  rank). spawn() keeps its caller out of any job (the caller's other children would end with it) and
  has that window for its ranks, while their interpreter starts up, before `fn` runs.
- A rank started with CREATE_NEW_PROCESS_GROUP leads a console process group: the console's Ctrl+C no
  longer reaches it (the flag disables Ctrl+C in the new group), and CTRL_BREAK_EVENT sent to the group
  (ctrl_break) reaches the rank and what it started on the same console, once. Python's default for it
  (SIGBREAK) ends the process; a rank can catch it with signal.signal(signal.SIGBREAK, handler). (A
  Ctrl+Break typed in the console reaches every process on it, the ranks too, and the launcher, which
  forwards it once more.)

Standard library only. Importable everywhere (nothing runs at import); kernel32 is bound on first use,
which happens only on Windows.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Optional

CREATE_NEW_PROCESS_GROUP = 0x00000200  # subprocess.CREATE_NEW_PROCESS_GROUP, defined on Windows only
TERMINATED = 1  # the exit code TerminateJobObject gives the processes it ends (as Popen.kill does)

_JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE = 0x00002000
_JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION = 1  # JOBOBJECTINFOCLASS values
_JOB_OBJECT_EXTENDED_LIMIT_INFORMATION = 9
_PROCESS_TERMINATE = 0x0001
_PROCESS_SET_QUOTA = 0x0100

# Windows' types with portable ctypes: DWORD is 32 bits, SIZE_T and ULONG_PTR pointer-sized (c_ulong
# is 64 bits on Linux, so it is not used: the layouts below are the same when checked there).


class _BasicLimitInformation(ctypes.Structure):  # JOBOBJECT_BASIC_LIMIT_INFORMATION
    _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64), ("PerJobUserTimeLimit", ctypes.c_int64),
                ("LimitFlags", ctypes.c_uint32), ("MinimumWorkingSetSize", ctypes.c_size_t),
                ("MaximumWorkingSetSize", ctypes.c_size_t), ("ActiveProcessLimit", ctypes.c_uint32),
                ("Affinity", ctypes.c_size_t), ("PriorityClass", ctypes.c_uint32),
                ("SchedulingClass", ctypes.c_uint32)]


class _IoCounters(ctypes.Structure):  # IO_COUNTERS
    _fields_ = [(name, ctypes.c_uint64) for name in ("ReadOperationCount", "WriteOperationCount",
                                                     "OtherOperationCount", "ReadTransferCount",
                                                     "WriteTransferCount", "OtherTransferCount")]


class _ExtendedLimitInformation(ctypes.Structure):  # JOBOBJECT_EXTENDED_LIMIT_INFORMATION
    _fields_ = [("BasicLimitInformation", _BasicLimitInformation), ("IoInfo", _IoCounters),
                ("ProcessMemoryLimit", ctypes.c_size_t), ("JobMemoryLimit", ctypes.c_size_t),
                ("PeakProcessMemoryUsed", ctypes.c_size_t), ("PeakJobMemoryUsed", ctypes.c_size_t)]


class _BasicAccountingInformation(ctypes.Structure):  # JOBOBJECT_BASIC_ACCOUNTING_INFORMATION
    _fields_ = [("TotalUserTime", ctypes.c_int64), ("TotalKernelTime", ctypes.c_int64),
                ("ThisPeriodTotalUserTime", ctypes.c_int64), ("ThisPeriodTotalKernelTime", ctypes.c_int64),
                ("TotalPageFaultCount", ctypes.c_uint32), ("TotalProcesses", ctypes.c_uint32),
                ("ActiveProcesses", ctypes.c_uint32), ("TotalTerminatedProcesses", ctypes.c_uint32)]


_kernel32 = None


def _k32():
    global _kernel32
    if _kernel32 is None:
        k = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        handle, dword, boolean, pointer = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_void_p
        for name, restype, argtypes in (
                ("CreateJobObjectW", handle, [pointer, ctypes.c_wchar_p]),
                ("SetInformationJobObject", boolean, [handle, ctypes.c_int, pointer, dword]),
                ("QueryInformationJobObject", boolean, [handle, ctypes.c_int, pointer, dword, pointer]),
                ("AssignProcessToJobObject", boolean, [handle, handle]),
                ("TerminateJobObject", boolean, [handle, ctypes.c_uint]),
                ("OpenProcess", handle, [dword, boolean, dword]),
                ("GetCurrentProcess", handle, []),
                ("CloseHandle", boolean, [handle])):
            function = getattr(k, name)
            function.restype, function.argtypes = restype, argtypes
        _kernel32 = k
    return _kernel32


def _error() -> OSError:
    return ctypes.WinError(ctypes.get_last_error())  # type: ignore[attr-defined]


class Job:
    """A job object whose processes are terminated when the last handle to it closes: close(), or the
    exit of the process that made it (the only holder). OSError when Windows refuses one."""

    def __init__(self) -> None:
        k = _k32()
        handle = k.CreateJobObjectW(None, None)  # no name, a handle that children do not inherit
        if not handle:
            raise _error()
        info = _ExtendedLimitInformation()
        info.BasicLimitInformation.LimitFlags = _JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
        if not k.SetInformationJobObject(handle, _JOB_OBJECT_EXTENDED_LIMIT_INFORMATION,
                                         ctypes.byref(info), ctypes.sizeof(info)):
            error = _error()
            k.CloseHandle(handle)
            raise error
        self._handle: Optional[int] = handle

    def add(self, pid: int) -> bool:
        """Puts process `pid` (a child of ours that we have not reaped: its pid cannot have been
        reused) in the job; False where Windows refuses (the process is then stopped on its own)."""
        k = _k32()
        process = k.OpenProcess(_PROCESS_SET_QUOTA | _PROCESS_TERMINATE, False, pid)
        if not process:
            return False
        try:
            return bool(k.AssignProcessToJobObject(self._handle, process))
        finally:
            k.CloseHandle(process)

    def active(self) -> int:
        """How many processes of the job still run (0 once closed)."""
        if self._handle is None:
            return 0
        info = _BasicAccountingInformation()
        if not _k32().QueryInformationJobObject(self._handle, _JOB_OBJECT_BASIC_ACCOUNTING_INFORMATION,
                                                ctypes.byref(info), ctypes.sizeof(info), None):
            return 0
        return info.ActiveProcesses

    def terminate(self) -> None:
        """TerminateJobObject: every process in it (and in jobs nested in it) ends, exit code TERMINATED."""
        if self._handle is not None:
            _k32().TerminateJobObject(self._handle, TERMINATED)

    def close(self) -> None:
        """Closes our handle, which terminates what is still in the job (KILL_ON_JOB_CLOSE)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            _k32().CloseHandle(handle)


def new_job(pid: Optional[int] = None) -> Optional[Job]:
    """A new job, with process `pid` in it if given; None where Windows refuses (then the processes
    are stopped one by one, as Popen.kill does)."""
    try:
        job = Job()
    except OSError:
        return None
    if pid is not None and not job.add(pid):
        job.close()
        return None
    return job


_own_job: Optional[Job] = None  # never closed: that would end this process (see enter_own_job)


def enter_own_job() -> bool:
    """Puts the calling process in a job of its own (once), so that the processes it starts, and what
    they start, are in a job from their first instruction and end when this process ends, however it
    ends. For a process that exists to run ranks (the launcher): everything it starts, even what is
    meant to outlive it, ends with it. False where Windows refuses (then the job that new_job(pid)
    gives each process just after it starts is all there is)."""
    global _own_job
    if _own_job is not None:
        return True
    job = new_job()
    if job is None:
        return False
    k = _k32()
    if not k.AssignProcessToJobObject(job._handle, k.GetCurrentProcess()):
        job.close()
        return False
    _own_job = job
    return True


def ctrl_break(pid: int) -> bool:
    """CTRL_BREAK_EVENT to the console process group that `pid` leads (started with
    CREATE_NEW_PROCESS_GROUP, still running: the group must exist); False where it cannot be delivered
    (no console, the group is gone)."""
    try:
        os.kill(pid, signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
    except OSError:
        return False
    return True
