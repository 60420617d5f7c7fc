"""Run Jupyter Book with every chapter's kernel on local (IPC) sockets, not TCP.

``python -m book.local_kernels build .`` is ``jupyter-book build .`` except for one thing: the
kernels that execute the chapters talk to Jupyter Book over Unix sockets in a private folder
(mode 0700) instead of TCP ports on 127.0.0.1.

Why: over TCP, ipykernel warns at every start that the traffic is not encrypted
(``IPKernelApp.init_sockets``: transport "tcp" without CurveZMQ keys), and the build log printed
that warning once per chapter. Jupyter Book's executor (myst-nb, then jupyter-cache, then
nbclient) makes its ``KernelManager`` with an empty config and reads no config file, so no
setting reaches it; the one place to choose the transport is the manager itself. Sockets in a
folder only this user can enter remove the warning's cause rather than hide it. The self-check
does the same through a config (:func:`coursekit.selfcheck.ipc_config`); nbgrader's commands read
``c.KernelManager.transport`` from ``nbgrader_config.py``.
"""
from __future__ import annotations

import sys
import tempfile


def use_local_sockets(folder: str) -> None:
    """Make every kernel manager this process creates from now on use IPC sockets in ``folder``."""
    from jupyter_client.manager import KernelManager

    original_init = KernelManager.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.transport = "ipc"
        self.ip = f"{folder}/kernel"  # sockets kernel-1, kernel-2, ... (a socket path is < 108 bytes)

    KernelManager.__init__ = __init__


def main(argv: list[str] | None = None) -> int:
    from jupyter_book.cli.main import main as jupyter_book

    args = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="book-kernels-") as folder:  # created 0700
        use_local_sockets(folder)
        try:  # as the jupyter-book script runs it: click turns every outcome into SystemExit
            jupyter_book(args=args, prog_name="jupyter-book")
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
