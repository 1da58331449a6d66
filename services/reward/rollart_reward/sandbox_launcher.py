"""Runs inside the bwrap sandbox as its first process: set rlimits, drop root, exec the command.

Kept free of imports beyond the standard library's core, and run with ``python -I``: nothing from the
environment or the working directory is trusted. Argument: one JSON object {rlimits, uid, argv, env}.
"""

import json
import os
import resource
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    uid = int(spec["uid"])
    if os.getuid() == 0:
        # A non-root real uid: RLIMIT_NPROC applies (root is exempt) and root-only files stay unreadable.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.umask(0o022)
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main()
