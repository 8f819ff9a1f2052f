"""The seccomp filter of the local sandbox: the system calls an agent has no use for, refused.

Inside the local sandbox the agent is root of its own user namespace with no capabilities
(:mod:`tr.envs.local`), so most privileged calls fail anyway; this filter removes the kernel
surface that stays reachable without capabilities, as Docker's default profile does:

* new namespaces: ``unshare``, ``clone`` with any ``CLONE_NEW*`` flag, ``clone3`` (ENOSYS, so C
  libraries fall back to ``clone``, whose flags can be checked) -- a nested user namespace would
  hand the agent capabilities again;
* the kernel keyring (not namespaced), ``bpf``, ``perf_event_open``, ``userfaultfd``, io_uring;
* modules, kexec, reboot, swap, accounting, quotas, the kernel log, clocks, host and domain
  names, every mount call, ``open_by_handle_at``, ``lookup_dcookie``, ``uselib``, ``iopl``.

Refused calls return EPERM (ENOSYS for ``clone3``); a call of another ABI (x32, 32-bit) is
refused whole.  :func:`program` builds the classic-BPF program ``bwrap --seccomp FD`` loads:
load ``arch`` and stop other ABIs, load ``nr``, one ``jeq`` per refused call, then for ``clone``
a ``jset`` of the namespace flags in ``args[0]``.  ``setns`` stays allowed: the sandbox launcher
enters its user namespace with it after the filter is in place, and without capabilities and new
namespaces the agent can join none.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                   | 0x40000000)   # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET

REFUSED = (
    "unshare", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "syslog", "mount", "umount2", "pivot_root", "open_tree",
    "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "open_by_handle_at", "lookup_dcookie", "settimeofday", "clock_settime", "clock_adjtime",
    "sethostname", "setdomainname", "vhangup", "nfsservctl", "fanotify_init",
    # x86 only
    "uselib", "iopl", "ioperm",
)

# name -> number per ABI (checked against the kernel headers in tests/test_hardening.py).
SYSCALLS = {
    "x86_64": {
        "clone": 56, "clone3": 435, "unshare": 272, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
        "quotactl": 179, "quotactl_fd": 443, "syslog": 103, "mount": 165, "umount2": 166,
        "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_by_handle_at": 304,
        "lookup_dcookie": 212, "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305,
        "sethostname": 170, "setdomainname": 171, "vhangup": 153, "nfsservctl": 180,
        "fanotify_init": 300, "uselib": 134, "iopl": 172, "ioperm": 173,
    },
    "aarch64": {
        "clone": 220, "clone3": 435, "unshare": 97, "keyctl": 219, "add_key": 217,
        "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
        "quotactl": 60, "quotactl_fd": 443, "syslog": 116, "mount": 40, "umount2": 39,
        "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_by_handle_at": 265,
        "lookup_dcookie": 18, "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266,
        "sethostname": 161, "setdomainname": 162, "vhangup": 58, "nfsservctl": 42,
        "fanotify_init": 262,
    },
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one) as packed ``struct sock_filter``s, or None
    for an architecture without a table here (the sandbox then runs without a filter)."""
    machine = machine or platform.machine()
    table = SYSCALLS.get(machine)
    if table is None:
        return None
    refused = sorted({table[name] for name in REFUSED if name in table})
    # Layout: [arch checks][nr checks ...][ALLOW][clone check: ld, jset, ALLOW][EPERM][ENOSYS]
    head = 3 if machine == "x86_64" else 2      # ld arch, jeq arch, (x32 check on x86_64)
    checks = len(refused) + 2                   # refused..., clone, clone3
    n_before_allow = 1 + head + checks          # + ld nr
    allow_at = n_before_allow
    clone_at = allow_at + 1
    eperm_at = clone_at + 3
    enosys_at = eperm_at + 1

    out: list[bytes] = []

    def jump_to(target: int) -> int:
        offset = target - (len(out) + 1)
        if not 0 <= offset <= 255:
            raise AssertionError(f"seccomp program jump of {offset} does not fit")
        return offset

    out.append(_insn(LD_W_ABS, OFFSET_ARCH))
    out.append(_insn(JEQ_K, AUDIT_ARCH[machine], 0, jump_to(eperm_at)))
    out.append(_insn(LD_W_ABS, OFFSET_NR))
    if machine == "x86_64":
        out.append(_insn(JGE_K, X32_SYSCALL_BIT, jump_to(eperm_at), 0))
    for nr in refused:
        out.append(_insn(JEQ_K, nr, jump_to(eperm_at), 0))
    out.append(_insn(JEQ_K, table["clone"], jump_to(clone_at), 0))
    out.append(_insn(JEQ_K, table["clone3"], jump_to(enosys_at), 0))
    assert len(out) == allow_at, (len(out), allow_at)
    out.append(_insn(RET_K, RET_ALLOW))
    out.append(_insn(LD_W_ABS, OFFSET_ARG0))
    out.append(_insn(JSET_K, CLONE_NEW_FLAGS, jump_to(eperm_at), 0))
    out.append(_insn(RET_K, RET_ALLOW))
    assert len(out) == eperm_at
    out.append(_insn(RET_K, RET_ERRNO | errno.EPERM))
    out.append(_insn(RET_K, RET_ERRNO | errno.ENOSYS))
    return b"".join(out)
