"""Whether a client may have the gateway open a shared-memory object for it: the gateway must never be a
way into a file its client could not open itself (it may run as root, or as the owner of other objects).

The gateway opens the object first (as itself: ``O_NOFOLLOW``, no blocking) and then judges *that open
file* (``fstat`` of the same descriptor, so nothing can be swapped between the check and the use) by the
permission bits, for the client's uid as the kernel records it (``peers.owner_uid``), needing read and write
(the gateway reads inputs from a region and writes outputs into it):

    uid 0                 may (root opens any object itself)
    the object's owner    the owner bits
    in the object's group the group bits; membership is the account's groups (``os.getgrouplist`` of the
                          uid's passwd entry; a uid without one is in no group)
    anyone else           the other bits
    an access ACL         only root and the owner (whose bits an ACL never changes): named entries and the
                          mask are not interpreted here, so nothing an ACL forbids is granted

Not interpreted: security modules (SELinux, AppArmor) and supplementary groups a process holds beyond its
account's; the rules above then refuse or grant as the bits say.
"""
from __future__ import annotations

import errno
import os
import pwd
import stat

ACL = "system.posix_acl_access"
RW = {"owner": stat.S_IRUSR | stat.S_IWUSR, "group": stat.S_IRGRP | stat.S_IWGRP,
      "other": stat.S_IROTH | stat.S_IWOTH}


def groups_of(uid: int) -> set[int]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return set()
    try:
        return set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        return {entry.pw_gid}


def has_acl(fd: int) -> bool:
    try:
        os.getxattr(fd, ACL)
    except OSError as exc:
        if exc.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            return False
        return True  # unknown: judged as if it had one (owner only)
    return True


def class_of(st: os.stat_result, uid: int, fd: int) -> str | None:
    """Whose bits apply to ``uid`` for the open object ``fd`` (``st`` its fstat); None: root."""
    if uid == 0:
        return None
    if st.st_uid == uid:
        return "owner"
    if has_acl(fd):
        return "acl"
    return "group" if st.st_gid in groups_of(uid) else "other"


def may_open(st: os.stat_result, uid: int, fd: int) -> bool:
    """``uid`` could open this object read/write itself."""
    which = class_of(st, uid, fd)
    if which is None:
        return True
    bits = RW.get(which)
    return bits is not None and st.st_mode & bits == bits
