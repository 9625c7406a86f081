"""A multi-worker start that cannot hang: wait for the peers before TF does.

MultiWorkerMirroredStrategy blocks at start-up until every worker has
registered with the coordination service. That wait is one C++ call that
holds the GIL (no Python thread runs: no progress line, no Python signal
handler), and TF's preemption notifier takes SIGTERM as soon as the service
starts, so a worker whose peer never comes up sat there silently for
`cluster_register_timeout_s` and ignored SIGTERM.

`WaitForPeers` does the waiting first, in Python, where signals work:

  listen on this worker's own port      (a port in use is named at once;
                                         no connection is ever accepted)
  every poll_s: try a TCP connection to every peer that has not answered
  every interval_s: log the peers that do not accept connections yet
  after timeout_s: PeersMissingError naming each missing worker and address
  close the listener; the caller then starts TF's server on that port

Every worker listens on its own port while it waits, so each finds the
others whichever starts first; a peer that has already moved on to TF's
server accepts there. TF's own registration timeout (the same flag) bounds
what is left: a peer that dies between the two waits.

Pure Python: importing it does no TF work.
"""

import errno
import socket
import time
from typing import Callable, List, Optional, Sequence, Tuple

# How long one connection attempt to a peer may take.
_CONNECT_TIMEOUT_S = 1.0


class PeersMissingError(RuntimeError):
  """Some workers did not start within the wait; names them."""


class PortInUseError(OSError):
  """This worker's own port is taken by another process."""


def SplitAddress(address: str) -> Tuple[str, int]:
  """'host:port' or '[v6]:port' -> (host, port)."""
  host, _, port = address.rpartition(':')
  return host.strip('[]'), int(port)


def Listen(address: str, name: str) -> socket.socket:
  """Binds and listens on `address`'s port on every interface.

  Raises:
    PortInUseError: naming the port, the task and the fix.
  """
  host, port = SplitAddress(address)
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  # The same option TF's gRPC server sets: a port in TIME_WAIT is not busy.
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind(('', port))
    sock.listen(64)
  except OSError as e:
    sock.close()
    if e.errno == errno.EADDRINUSE:
      raise PortInUseError(
          f'port {port} of {name} ({address}) is already in use by another '
          'process; stop that process or give this worker another port') from None
    raise
  return sock


def Accepts(address: str, timeout_s: float = _CONNECT_TIMEOUT_S) -> bool:
  """Whether a TCP connection to `address` succeeds now."""
  try:
    host, port = SplitAddress(address)
    with socket.create_connection((host, port), timeout=timeout_s):
      return True
  except (OSError, ValueError):
    return False


def WaitForPeers(own: Tuple[str, str], peers: Sequence[Tuple[str, str]],
                 timeout_s: float, log_fn: Callable[[str], None],
                 interval_s: float = 10.0, poll_s: float = 0.2,
                 flag: str = '--peer_wait_s',
                 accepts: Optional[Callable[[str], bool]] = None) -> float:
  """Waits until every peer accepts a TCP connection; returns the seconds.

  Args:
    own: (name, 'host:port') of this worker, e.g. ('worker 0', ...).
    peers: (name, 'host:port') of every other task.
    timeout_s: give up after this long.
    log_fn: gets a progress line about every `interval_s`.
    interval_s: seconds between progress lines.
    poll_s: seconds between rounds of connection attempts.
    flag: the setting that changes `timeout_s`, for the messages.
    accepts: the probe (tests); default a TCP connect.

  Raises:
    PortInUseError: this worker's own port is taken.
    PeersMissingError: peers still missing after `timeout_s`.
  """
  accepts = accepts or Accepts
  listener = Listen(own[1], own[0])
  start = time.monotonic()
  next_line = start + interval_s
  missing: List[Tuple[str, str]] = list(peers)
  try:
    while True:
      missing = [(n, a) for n, a in missing if not accepts(a)]
      elapsed = time.monotonic() - start
      if not missing:
        return elapsed
      names = ', '.join(f'{n} at {a}' for n, a in missing)
      if elapsed >= timeout_s:
        raise PeersMissingError(
            f'{names} did not start within {timeout_s:g} s (no connection '
            'accepted): start every worker with the same cluster, or wait '
            f'longer with {flag}')
      if time.monotonic() >= next_line:
        log_fn(f'{own[0]}: waiting for {names} (not accepting connections '
               f'yet; {elapsed:.0f} of {timeout_s:g} s, {flag})')
        next_line += interval_s
      time.sleep(poll_s)
  finally:
    listener.close()


def WaitForExit(peers: Sequence[Tuple[str, str]], timeout_s: float,
                poll_s: float = 0.1,
                accepts: Optional[Callable[[str], bool]] = None) -> List[str]:
  """Waits until no peer accepts connections (their processes have ended).

  The chief hosts TF's coordination service: if it exits first, a worker
  still shutting down logs "Failed to send RPC to coordination service ...
  Connection refused". The chief calls this last, so it ends after them.

  Returns:
    The names of the peers still up after `timeout_s` (normally none).
  """
  accepts = accepts or Accepts
  deadline = time.monotonic() + timeout_s
  up = list(peers)
  while up:
    up = [(n, a) for n, a in up if accepts(a)]
    if not up or time.monotonic() >= deadline:
      break
    time.sleep(poll_s)
  return [n for n, _ in up]
