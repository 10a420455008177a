"""The only directories a server writes on a worker's request.

``SAVE_CHECKPOINT`` carries a directory chosen by the sender (optimizer states carry no
path: the worker writes their files, :mod:`pskv.kvstore.state_files`). MXNet's servers
used a sender's path as given; a pskv server accepts it only if it lies, after resolving
``..`` and every symbolic link, inside one of the directories fixed when the server
started (:class:`AllowedPaths`):

* the state directory, ``PSKV_STATE_DIR`` — by default the server's working directory
  at start, which ``pskv launch`` makes the job's working directory (locally it is the
  launcher's; over ssh, its ``cd`` before every remote command);
* the checkpoint directory, ``PSKV_CHECKPOINT_DIR``, if set.

A worker sends absolute paths (resolved against its own working directory), so
``kv.save_checkpoint("ckpts/first")`` names the same directory on both sides of a job
whose processes share a working directory. A relative path from a peer is resolved
against the state directory. Anything else is refused with
:class:`~pskv.errors.InvalidArgumentError` naming the path and the allowed directories.
"""

from __future__ import annotations

import os

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError

__all__ = ["AllowedPaths"]


class AllowedPaths:
    """Where a server may write and read the files a request names.

    Args:
        roots: the allowed directories (empty entries are skipped); the first one
            resolves relative paths. Resolved once, here: a link changed later does
            not widen them.

    Raises:
        InvalidArgumentError: no directory given.
    """

    def __init__(self, roots: list[str]) -> None:
        resolved: list[str] = []
        for root in roots:
            if root and os.path.realpath(root) not in resolved:
                resolved.append(os.path.realpath(root))
        if not resolved:
            raise InvalidArgumentError("a server needs at least one directory for state files")
        self.roots = tuple(resolved)

    @classmethod
    def of(cls, cluster: ClusterConfig) -> AllowedPaths:
        """``PSKV_STATE_DIR`` (default: the working directory now) and ``PSKV_CHECKPOINT_DIR``."""
        return cls([cluster.state_dir or os.getcwd(), cluster.checkpoint_dir])

    def check(self, path: str, what: str) -> str:
        """``path`` resolved (``..`` and symbolic links), if it lies inside an allowed directory.

        Args:
            path: the path a request named.
            what: who asks for what, for the message (``'server 0: save_checkpoint'``).

        Raises:
            InvalidArgumentError: the resolved path lies outside every allowed directory
                (or ``path`` holds a NUL character).
        """
        if "\0" in path:
            raise InvalidArgumentError(f"{what}: refused path {path!r}: it holds a NUL character")
        resolved = os.path.realpath(os.path.join(self.roots[0], path))
        if not any(resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep) for root in self.roots):
            raise InvalidArgumentError(
                f"{what}: refused path {path!r} (resolved: {resolved}): outside the directories this server "
                f"writes and reads ({', '.join(self.roots)}); use a path inside them, or start the servers with "
                "PSKV_STATE_DIR (pskv launch --env PSKV_STATE_DIR=DIR) or PSKV_CHECKPOINT_DIR (pskv launch "
                "--checkpoint-dir DIR) naming its directory"
            )
        return resolved
