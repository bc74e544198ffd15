"""`mqmeta chaos faultfs mount | unmount | lose-power | delay | fail-fsync | disk-full |
sync | status`: the fault filesystem from a shell. Every command but mount finds the
mount's control socket from the mountpoint (control.default_control_path) unless given
`--control`; each prints the filesystem's status as one JSON document."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from mqmeta.chaos.faultfs.control import DELAY_MS_MAX, FAILURES_MAX, FaultFsControl, default_control_path
from mqmeta.cluster.wait import WaitTimeout, wait_for

from mqmeta.errors import FailedPrecondition, InvalidArgument
from mqmeta.validate import FlagNumber

UNMOUNT_WAIT_S = 30.0
SEED_MAX = 2**63 - 1


def add_faultfs_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="faultfs_command", required=True, parser_class=type(parser))
    mount = sub.add_parser("mount", help="mount BACKING at MOUNTPOINT (in the background)")
    mount.add_argument("backing", type=Path, help="the real directory holding the durable state")
    mount.add_argument("mountpoint", type=Path)
    mount.add_argument("--log", type=Path, help="the filesystem's log (MOUNTPOINT.faultfs.log)")
    mount.add_argument("--foreground", action="store_true", help="serve in this process until unmounted")
    _control(mount)
    for name, text in (
        ("unmount", "unmount (a clean unmount makes everything durable) and stop the process"),
        ("lose-power", "drop every write and directory entry not fsynced (stop its users first)"),
        ("sync", "make everything durable (sync(2))"),
        ("status", "faults set and counters"),
    ):
        command = _control(sub.add_parser(name, help=text))
        command.add_argument("mountpoint", type=Path)
        if name == "lose-power":
            command.add_argument(
                "--writeback-fraction",
                type=FlagNumber("--writeback-fraction", float, 0.0, 1.0),
                default=0.0,
                help="each dirty page was written back before the cut with this probability (0)",
            )
            command.add_argument("--seed", type=FlagNumber("--seed", int, 0, SEED_MAX), default=0)
    delay = _control(sub.add_parser("delay", help="delay every fsync and/or read (0: none)"))
    delay.add_argument("mountpoint", type=Path)
    delay.add_argument("--fsync-ms", type=FlagNumber("--fsync-ms", int, 0, DELAY_MS_MAX))
    delay.add_argument("--read-ms", type=FlagNumber("--read-ms", int, 0, DELAY_MS_MAX))
    fail = _control(sub.add_parser("fail-fsync", help="the next fsyncs fail with EIO"))
    fail.add_argument("mountpoint", type=Path)
    fail.add_argument("--count", type=FlagNumber("--count", int, 0, FAILURES_MAX), default=1)
    fail.add_argument(
        "--under", default="/", help="only fsyncs of paths under this one, inside the mount (/)"
    )
    full = _control(sub.add_parser("disk-full", help="writes fail with ENOSPC (on) or not (off)"))
    full.add_argument("mountpoint", type=Path)
    full.add_argument("state", choices=("on", "off"))


def _control(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--control", type=Path, help="the control socket (beside the mountpoint)")
    return parser


def run_faultfs(args: argparse.Namespace) -> int:
    command = args.faultfs_command
    if command == "mount":
        return _mount(args)
    control = FaultFsControl(args.control or default_control_path(args.mountpoint))
    if not control.path.exists():
        raise InvalidArgument(f"no fault filesystem is mounted at {args.mountpoint} (no {control.path})")
    status: dict[str, Any]
    if command == "unmount":
        status = _unmount(args.mountpoint, control)
    elif command == "lose-power":
        status = control.lose_power(args.writeback_fraction, args.seed)
    elif command == "delay":
        status = control.delay(args.fsync_ms, args.read_ms)
    elif command == "fail-fsync":
        status = control.fail_next_fsync(args.count, args.under)
    elif command == "disk-full":
        status = control.disk_full(args.state == "on")
    elif command == "sync":
        status = control.sync()
    else:
        status = control.status()
    print(json.dumps(status, indent=2, sort_keys=True))
    return 0


def _mount(args: argparse.Namespace) -> int:
    from mqmeta.chaos.faultfs.mount import FaultFs, check_can_mount, serve

    control = args.control or default_control_path(args.mountpoint)
    if args.foreground:
        check_can_mount()
        serve(args.backing.resolve(), args.mountpoint.resolve(), control)
        return 0
    log = args.log or Path(f"{args.mountpoint.resolve()}.faultfs.log")
    mounted = FaultFs.mount(args.backing, args.mountpoint, control, log_path=log)
    print(json.dumps({**mounted.describe(), "log": str(log)}, indent=2))
    return 0


def _unmount(mountpoint: Path, control: FaultFsControl) -> dict[str, Any]:
    status = control.status()
    done = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True, text=True)
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
        raise FailedPrecondition(f"cannot unmount {mountpoint}: {reason}")
    try:  # the process writes the durable tree back, then removes its socket
        wait_for(lambda: not control.path.exists(), UNMOUNT_WAIT_S, f"{control.path} removed")
    except WaitTimeout as error:
        raise FailedPrecondition(str(error)) from error
    return status
