"""A multi-worker start that cannot hang: wait for the peers before TF does.

MultiWorkerMirroredStrategy blocks at start-up until every worker has
registered with the coordination service. That wait is one C++ call that
holds the GIL (no Python thread runs: no progress line, no Python signal
handler), and TF's preemption notifier takes SIGTERM as soon as the service
starts, so a worker whose peer never comes up sat there silently for
`cluster_register_timeout_s` and ignored SIGTERM.

`WaitForPeers` does the waiting first, in Python, where signals work:

  listen on this worker's own port      (a port in use is named at once)
  answer every connection with BANNER   (a thread, until the wait ends)
  every poll_s: probe every peer that has not answered as a worker
  every interval_s: log the peers that do not answer yet
  after timeout_s: PeersMissingError naming each missing worker, its
                   address and what it did (refused / answered otherwise)
  close the listener; the caller then starts TF's server on that port

A TCP connection alone does not tell a worker from another program holding
its port (a stale process, another service): TF's registration would then
wait its whole timeout, holding the GIL and with SIGTERM taken by TF's
preemption notifier. So `Probe` sends HTTP/2's client preface and reads
the answer:

  peer                                  answer              Probe
  a worker in its WaitForPeers          BANNER              WORKER
  a worker whose TF server is up        HTTP/2 SETTINGS     WORKER
  nothing listening                     (refused)           REFUSED
  another program (a bare listener,     silence, other      OTHER
  a web server, ...)                    bytes, or closed

Every worker listens on its own port while it waits, so each finds the
others whichever starts first; a peer that has already moved on to TF's
server answers there. TF's own registration timeout (the same flag) bounds
what is left: a peer that dies between the two waits, or a TF server of
another run (the trainer names them: `RegistrationError` in cluster.py).

Pure Python: importing it does no TF work.
"""

import errno
import socket
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

# How long one connection attempt to a peer, and the wait for its answer,
# may take.
_CONNECT_TIMEOUT_S = 1.0

# What a waiting worker's listener writes to every connection.
BANNER = b'tensorpipe peer_wait\n'
# HTTP/2's client connection preface and an empty SETTINGS frame: a gRPC
# server (TF's) answers with its own SETTINGS frame.
_HTTP2_PREFACE = (b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' +
                  b'\x00\x00\x00\x04\x00\x00\x00\x00\x00')
_SETTINGS = 4  # HTTP/2 frame type

# Probe results.
REFUSED = 'refused'   # no connection
WORKER = 'worker'     # a waiting worker, or a gRPC (TF) server
OTHER = 'other'       # accepts connections, answers neither way


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


def _Enough(data: bytes) -> bool:
  """Whether `data` decides a probe: all of BANNER, or 9 other bytes (an
  HTTP/2 frame header)."""
  if BANNER.startswith(data):
    return len(data) == len(BANNER)
  return len(data) >= 9


def Probe(address: str, timeout_s: float = _CONNECT_TIMEOUT_S) -> str:
  """What answers at `address`: REFUSED, WORKER or OTHER (module docstring)."""
  try:
    host, port = SplitAddress(address)
    sock = socket.create_connection((host, port), timeout=timeout_s)
  except (OSError, ValueError):
    return REFUSED
  data = b''
  with sock:
    try:
      sock.sendall(_HTTP2_PREFACE)
      deadline = time.monotonic() + timeout_s
      while not _Enough(data):
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        chunk = sock.recv(len(BANNER) - len(data))
        if not chunk:
          break
        data += chunk
    except OSError:
      pass  # silence (timeout) or a reset: judged on what came
  if data.startswith(BANNER):
    return WORKER
  if len(data) >= 9 and data[3] == _SETTINGS and data[5:9] == bytes(4):
    return WORKER
  return OTHER


class _Answerer:
  """Answers every connection to `listener` with BANNER, in a thread."""

  def __init__(self, listener: socket.socket):
    self._listener = listener
    self._stop = threading.Event()
    listener.settimeout(0.05)
    self._thread = threading.Thread(target=self._Run, daemon=True,
                                    name='peer_wait_answer')
    self._thread.start()

  def _Run(self) -> None:
    while not self._stop.is_set():
      try:
        conn, _ = self._listener.accept()
      except socket.timeout:
        continue
      except OSError:
        return  # closed
      with conn:
        try:
          conn.settimeout(_CONNECT_TIMEOUT_S)
          conn.sendall(BANNER)
        except OSError:
          pass

  def Close(self) -> None:
    self._stop.set()
    self._thread.join()
    self._listener.close()


def _Describe(found: Sequence[Tuple[str, str, str]], timeout_s: float,
              flag: str) -> str:
  refused = ', '.join(f'{n} at {a}' for n, a, r in found if r == REFUSED)
  other = ', '.join(f'{n} at {a}' for n, a, r in found if r == OTHER)
  parts = []
  if refused:
    parts.append(f'{refused} did not start within {timeout_s:g} s (no '
                 'connection accepted): start every worker with the same '
                 f'cluster, or wait longer with {flag}')
  if other:
    parts.append(f'{other} accepts connections but did not answer as a '
                 f'TensorPipe worker within {timeout_s:g} s: is another '
                 'program using that port? Stop it, or give that worker '
                 'another port in every worker\'s cluster')
  return '; '.join(parts)


def WaitForPeers(own: Tuple[str, str], peers: Sequence[Tuple[str, str]],
                 timeout_s: float, log_fn: Callable[[str], None],
                 interval_s: float = 10.0, poll_s: float = 0.2,
                 flag: str = '--peer_wait_s',
                 probe: Optional[Callable[[str], str]] = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> float:
  """Waits until every peer answers as a worker; returns the seconds.

  Args:
    own: (name, 'host:port') of this worker, e.g. ('worker 0', ...).
    peers: (name, 'host:port') of every other task.
    timeout_s: give up after this long.
    log_fn: gets a progress line about every `interval_s`.
    interval_s: seconds between progress lines.
    poll_s: seconds between rounds of probes.
    flag: the setting that changes `timeout_s`, for the messages.
    probe: address -> REFUSED / WORKER / OTHER (tests); default `Probe`.
    clock, sleep: time (tests).

  Raises:
    PortInUseError: this worker's own port is taken.
    PeersMissingError: peers still missing after `timeout_s`.
  """
  probe = probe or Probe
  answerer = _Answerer(Listen(own[1], own[0]))
  start = clock()
  next_line = start + interval_s
  missing: List[Tuple[str, str]] = list(peers)
  try:
    while True:
      found = [(n, a, probe(a)) for n, a in missing]
      found = [f for f in found if f[2] != WORKER]
      missing = [(n, a) for n, a, _ in found]
      elapsed = clock() - start
      if not missing:
        return elapsed
      if elapsed >= timeout_s:
        raise PeersMissingError(_Describe(found, timeout_s, flag))
      if clock() >= next_line:
        names = ', '.join(f'{n} at {a}' + (
            '' if r == REFUSED else ' (accepts connections, no answer)')
                          for n, a, r in found)
        log_fn(f'{own[0]}: waiting for {names} (not answering as a worker '
               f'yet; {elapsed:.0f} of {timeout_s:g} s, {flag})')
        next_line += interval_s
      sleep(poll_s)
  finally:
    answerer.Close()


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
